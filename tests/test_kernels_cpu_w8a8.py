"""The W8A8 CPU kernel (kernels/cpu/w8a8.c, and w8a8_avx512.c where the CPU has AVX-512 VNNI) against its torch
reference and a float32 matmul, its bias + GELU epilogue against float64 GELU, and LowBitHead with it. Skipped, saying
why, where the C kernels cannot be built (not x86 AVX2, no C compiler)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from backend.quant.kept_output import KeptOutput
from backend.quant.lm_head import LowBitHead
from kernels.cpu.w8a8 import (
    gelu_ref,
    has_octets,
    load_w8a8,
    pack_w8a8,
    unpack_w8a8,
    w8a8_group,
    w8a8_linear,
    w8a8_linear_ref,
)
from tests.c_kernels import ISAS, assert_rows_invariant_on_every_isa, build, requires_c_kernels

pytestmark = requires_c_kernels


@pytest.fixture(scope="module", params=ISAS)
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each instruction set's kernel this CPU runs (w8a8.c, w8a8_avx512.c)."""
    return build(partial(load_w8a8, isa=request.param), tmp_path_factory, f"w8a8-{request.param}")


@pytest.mark.parametrize(("n", "k"), [(40, 576), (17, 544), (64, 128)])  # groups of 64, of 32; odd rows
@pytest.mark.parametrize("rows", [1, 4, 6, 33])
def test_matches_reference_and_float_matmul(lib, n: int, k: int, rows: int) -> None:
    g = torch.Generator().manual_seed(n + rows)
    weight = torch.randn(n, k, generator=g) * 0.05
    weight[0, 0] = -weight.abs().max() * 3  # the most negative value maps to -127 (sign handling)
    w = pack_w8a8(weight)
    assert w.group_size == w8a8_group(k) and w.q.min().item() == -127
    x = torch.randn(rows, k, generator=g)
    y = w8a8_linear(lib, x, w)
    ref = w8a8_linear_ref(x, w)
    assert y.shape == (rows, n)
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5
    exact = x @ weight.T
    assert ((y - exact).norm() / exact.norm()).item() < 0.02


@pytest.mark.parametrize("epilogue", [False, True])
def test_a_row_does_not_depend_on_its_batch(lib, epilogue: bool) -> None:
    w = pack_w8a8(torch.randn(48, 256))
    x = torch.randn(37, 256)
    bias = torch.randn(48) if epilogue else None
    full = w8a8_linear(lib, x, w, bias, gelu=epilogue)
    for rows in (slice(5, 6), slice(0, 4), slice(3, 36)):
        assert torch.equal(w8a8_linear(lib, x[rows], w, bias, gelu=epilogue), full[rows])


@pytest.mark.parametrize(("n", "k"), [(1536, 384), (40, 576), (21, 544)])  # the encoder's up-projection; 8-column tails
@pytest.mark.parametrize("rows", [1, 10])
def test_bias_and_gelu_epilogue(lib, n: int, k: int, rows: int) -> None:
    g = torch.Generator().manual_seed(n + rows)
    w = pack_w8a8(torch.randn(n, k, generator=g) * 0.3)
    x, bias = torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    plain = w8a8_linear(lib, x, w)
    with_bias = w8a8_linear(lib, x, w, bias)
    assert torch.equal(with_bias, plain + bias)  # the rounded product plus the bias, as torch's separate add
    out = w8a8_linear(lib, x, w, bias, gelu=True)
    assert with_bias.min() < -4 and with_bias.max() > 4  # GELU's tail and its linear part are both exercised
    # relative, even in the tail (atol: below x ~ -13 GELU is under 1e-38, where the kernel's exp saturates)
    torch.testing.assert_close(out.double(), gelu_ref(with_bias), rtol=1e-6, atol=1e-30)
    ref = w8a8_linear_ref(x, w, bias, gelu=True)
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-5
    # torch's own F.gelu is itself approximate, by ISA (AVX2: up to ~4e-7 off exact; AVX-512: ~8e-7): within that of ours
    torch.testing.assert_close(out, F.gelu(with_bias), rtol=1e-6, atol=1e-6)


def test_gelu_over_its_whole_range(lib) -> None:
    """An identity weight puts chosen values into the epilogue: within 1e-6 relative of float64 GELU from -12 (where
    GELU is -2e-32) to 12, and saturated beyond."""
    eye = pack_w8a8(torch.eye(64))
    x = torch.linspace(-12, 12, 64 * 1000).view(-1, 64)
    pre = w8a8_linear(lib, x, eye)
    torch.testing.assert_close(w8a8_linear(lib, x, eye, gelu=True).double(), gelu_ref(pre), rtol=1e-6, atol=0)
    extremes = torch.tensor([30.0, -30.0, 1e4, -1e4, 0.0])
    rows = torch.zeros(5, 64)
    rows[range(5), range(5)] = extremes  # one value a row, so each has its own quantization scale
    out = w8a8_linear(lib, rows, eye, gelu=True).diagonal()
    assert out[0] == pytest.approx(30, rel=1e-6) and out[2] == pytest.approx(1e4, rel=1e-6)
    assert abs(out[1]) < 1e-30 and abs(out[3]) < 1e-30 and out[4] == 0


def test_shapes_it_cannot_take() -> None:
    assert w8a8_group(100) == 0
    with pytest.raises(AssertionError, match="multiple of 32"):
        pack_w8a8(torch.randn(4, 100))


@pytest.mark.parametrize("rows", [1, 32])
def test_lm_head_with_the_kernel_keeps_only_int8_rows(lib, rows: int) -> None:
    weight, bias = torch.randn(300, 128) * 0.05, torch.randn(300)
    head = LowBitHead(weight, bias, lib)
    assert head.w8a8_lib is not None and not hasattr(head, "dense")
    assert head.weight_bytes() == {"int8": 300 * 128 + 300 * 4}
    x = torch.randn(rows, 128)
    ref = x @ weight.T + bias
    assert ((head(x) - ref).norm() / ref.norm()).item() < 0.02
    assert LowBitHead(torch.randn(10, 100), None, lib).w8a8_lib is None  # K not a multiple of 32: torch's path


def test_octets_layout() -> None:
    """w8a8_octets.h's layout byte by byte: per 8 rows, 32-byte chunks whose int32 lane l is row l's four values."""
    w = pack_w8a8(torch.randn(16, 64, generator=torch.Generator().manual_seed(1)), octets=True)
    rows = pack_w8a8(torch.randn(16, 64, generator=torch.Generator().manual_seed(1)))
    assert w.octets and w.q.shape == (16, 64) and torch.equal(unpack_w8a8(w), rows.q)
    chunk = w.q.reshape(-1)[8 * 64 + 3 * 32 : 8 * 64 + 4 * 32]  # octet 1, chunk 3: values 12..15 of rows 8..15
    assert torch.equal(chunk.view(8, 4), rows.q[8:16, 12:16])
    with pytest.raises(AssertionError, match="multiple of 8"):
        pack_w8a8(torch.randn(12, 64), octets=True)


@pytest.mark.parametrize(("n", "k"), [(40, 576), (24, 544), (48, 128)])  # groups of 64, of 32; a one-octet tail
@pytest.mark.parametrize("rows", [1, 4, 6, 33])
def test_octets_match_the_rows_and_reference(lib, n: int, k: int, rows: int) -> None:
    """The octets kernel against the same arithmetic in torch and the row layout's kernel (fp32 rounding apart)."""
    assert has_octets(lib)
    g = torch.Generator().manual_seed(n + rows)
    weight = torch.randn(n, k, generator=g) * 0.05
    weight[0, 0] = -weight.abs().max() * 3  # -127: the AVX-512 kernel's unsigned weights and their correction
    x = torch.randn(rows, k, generator=g)
    y = w8a8_linear(lib, x, pack_w8a8(weight, octets=True))
    plain = w8a8_linear(lib, x, pack_w8a8(weight))
    ref = w8a8_linear_ref(x, pack_w8a8(weight, octets=True))
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5
    assert ((y - plain).abs().max() / plain.abs().max()).item() < 1e-5
    with pytest.raises(AssertionError, match="no epilogue"):
        w8a8_linear(lib, x, pack_w8a8(weight, octets=True), torch.zeros(n))


def test_octets_rows_do_not_depend_on_their_batch_or_the_isa(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every row equals the row alone, bit for bit, on each instruction set; AVX2 and AVX-512 give the same bits."""
    w = pack_w8a8(torch.randn(56, 576, generator=torch.Generator().manual_seed(2)) * 0.05, octets=True)
    x = torch.randn(38, 576, generator=torch.Generator().manual_seed(3))
    assert_rows_invariant_on_every_isa(load_w8a8, w8a8_linear, w, x, tmp_path_factory, "w8a8-octets")


@pytest.mark.parametrize("rows", [1, 32])
def test_lm_head_without_bias_runs_octets(lib, rows: int) -> None:
    """The INT4 models' head (no bias, rows a multiple of 8) in octets; with a bias, or 8 not dividing its rows, in rows."""
    weight = torch.randn(304, 128, generator=torch.Generator().manual_seed(rows)) * 0.05
    head = LowBitHead(weight, None, lib)
    assert head.w8a8.octets and head.weight_bytes() == {"int8": 304 * 128 + 304 * 4}
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows + 1))
    ref = x @ weight.T
    assert ((head(x) - ref).norm() / ref.norm()).item() < 0.02
    assert not LowBitHead(weight, torch.zeros(304), lib).w8a8.octets
    assert not LowBitHead(weight[:300], None, lib).w8a8.octets


@pytest.mark.parametrize("bias", [False, True], ids=["octets", "rows"])
def test_lm_head_with_a_kept_output_gives_the_same_logits_in_one_tensor(lib, bias: bool) -> None:
    """The head's kept output (backend/quant/kept_output.py), both W8A8 layouts: each call's values are a fresh call's,
    and calls of up to MAX_ROWS rows write into the one tensor."""
    weight = torch.randn(304, 128, generator=torch.Generator().manual_seed(5)) * 0.05
    fresh = LowBitHead(weight, torch.randn(304) if bias else None, lib)
    kept = LowBitHead(weight, fresh.bias, lib)
    kept.kept_output = KeptOutput()
    assert kept.w8a8.octets == (has_octets(lib) and not bias)
    storages = []
    for rows in (3, 7, 5):
        x = torch.randn(rows, 128)
        y = kept(x)
        assert torch.equal(y, fresh(x))
        storages.append(y.untyped_storage().data_ptr())
    assert storages[1] == storages[2]
