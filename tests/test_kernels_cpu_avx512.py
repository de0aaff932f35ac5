"""The AVX-512 VNNI GEMMs (kernels/cpu/w4a8_avx512.c, w8a8_avx512.c) against the AVX2 kernels and the torch references:
the integer dot products exact on both, the fp32 results within fp32 rounding of each other, each row independent of
its batch-mates, group size 32 (GGUF Q4_1 blocks), and the run-time choice between them (build.cpu_isa,
SMOLGATE_CPU_ISA). Skipped, saying why, on CPUs without AVX-512 F/BW/VL + VNNI or without the C kernels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels.cpu.build import ISA_ENV, cpu_isa
from kernels.cpu.w4a8 import W4A8Weight, load_w4a8, pack_w4a8, unpack_w4a8, w4a8_linear, w4a8_linear_ref
from kernels.cpu.w8a8 import load_w8a8, pack_w8a8, w8a8_linear, w8a8_linear_ref
from tests.c_kernels import requires_avx512, requires_c_kernels

pytestmark = [requires_c_kernels, requires_avx512]
ISAS = ("avx2", "avx512")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One fresh build folder for both instruction sets' kernels (a clean build, not the user's cache)."""
    return Path(tmp_path_factory.mktemp("avx512"))


@pytest.fixture(scope="module")
def w4(folder: Path) -> dict[str, object]:
    libs = {isa: load_w4a8(folder, isa) for isa in ISAS}
    assert all(libs.values()), f"a kernel did not build (see the .log in {folder})"
    return libs


@pytest.fixture(scope="module")
def w8(folder: Path) -> dict[str, object]:
    libs = {isa: load_w8a8(folder, isa) for isa in ISAS}
    assert all(libs.values()), f"a kernel did not build (see the .log in {folder})"
    return libs


def int4(n: int, k: int, group: int, seed: int = 0, unit: bool = False) -> tuple[W4A8Weight, torch.Tensor]:
    """Random 4-bit weights in the kernels' layout and their dequantized values; unit: scales 1 and zeros 0 (y is
    then an integer matmul). Packed here rather than by pack_w4a8 so group 32 is tested before the AVX2 kernel
    takes it."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.ones(n, k // group) if unit else torch.rand(n, k // group, generator=g) * 0.02 + 1e-3
    zeros = torch.zeros(n, k // group) if unit else torch.randint(0, 16, (n, k // group), generator=g).float()
    blocks = q.reshape(n, k // 64, 2, 32)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    dense = ((q.double().view(n, -1, group) - zeros.double()[..., None]) * scales.double()[..., None]).view(n, k)
    return W4A8Weight(packed, scales.contiguous(), (zeros * scales).T.contiguous(), group), dense


def integer_rows(rows: int, k: int, group: int, seed: int) -> torch.Tensor:
    """int8-valued activations whose every group reaches |127|: quantized exactly, with scale 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (rows, k), generator=g).float()
    x.view(rows, -1, group)[:, :, 0] = 127.0
    return x


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize(("group", "k"), [(64, 576), (64, 1536), (128, 512), (256, 512)])  # 576: an odd block count
@pytest.mark.parametrize("rows", [1, 5])
def test_w4a8_integer_dot_products_are_exact_on_both(w4, group: int, k: int, rows: int) -> None:
    """Scales of 1, no zero points, activations already int8: y is the integer matmul, which fp32 holds exactly."""
    w, dense = int4(40, k, group, seed=k, unit=True)
    x = integer_rows(rows, k, group, seed=rows)
    exact = x.double() @ dense.T
    for isa in ISAS:
        assert torch.equal(w4a8_linear(w4[isa], x, w).double(), exact), isa


@pytest.mark.parametrize(("group", "k"), [(64, 576), (64, 1536), (128, 512), (256, 1024)])
@pytest.mark.parametrize("rows", [1, 3, 4, 9, 33])  # the decode tile, the 4-row tile and their tails
def test_w4a8_avx512_matches_avx2_and_reference(w4, group: int, k: int, rows: int) -> None:
    n = 44  # two 16-row chunks and a tail of 12: every weight-row tile and tail
    w, _ = int4(n, k, group, seed=group + rows)
    assert torch.equal(pack_w4a8(unpack_w4a8(w), w.scales, w.zeros_t.T / w.scales).q, w.q)  # the kernels' layout
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    y, y2 = w4a8_linear(w4["avx512"], x, w), w4a8_linear(w4["avx2"], x, w)
    assert rel(y, w4a8_linear_ref(x, w)) < 1e-5 and rel(y, y2) < 1e-5  # fp32 summation order apart


@pytest.mark.parametrize("k", [64, 576, 1536])  # one block; an odd block count (the masked tail chunk); many
@pytest.mark.parametrize("rows", [1, 4, 6])
def test_w4a8_group_32(w4, k: int, rows: int) -> None:
    """Group size 32 (GGUF Q4_1 blocks): a 64-value block's low nibbles are one group, its high nibbles the next."""
    w, dense = int4(36, k, 32, seed=k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k + rows))
    y = w4a8_linear(w4["avx512"], x, w)
    assert rel(y, w4a8_linear_ref(x, w)) < 1e-5
    assert ((y - x @ dense.float().T).norm() / y.norm()).item() < 0.05  # what int8 activations cost (K 64: ~2%)
    unit, exact_w = int4(36, k, 32, seed=k, unit=True)
    xi = integer_rows(rows, k, 32, seed=k)
    assert torch.equal(w4a8_linear(w4["avx512"], xi, unit).double(), xi.double() @ exact_w.T)


@pytest.mark.parametrize("group", [32, 64])
def test_w4a8_a_row_does_not_depend_on_its_batch(w4, group: int) -> None:
    w, _ = int4(52, 576, group, seed=group)
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(7))
    full = w4a8_linear(w4["avx512"], x, w)
    for rows in (slice(5, 6), slice(0, 4), slice(3, 36), slice(0, 33), slice(36, 37)):
        assert torch.equal(w4a8_linear(w4["avx512"], x[rows], w), full[rows])


@pytest.mark.parametrize("k", [576, 544])  # groups of 64; of 32 with a half chunk at the end
@pytest.mark.parametrize("rows", [1, 5])
def test_w8a8_integer_dot_products_are_exact_on_both(w8, k: int, rows: int) -> None:
    """Weight rows reaching |127| (scale 1) and int8-valued activations: y is the integer matmul, exactly."""
    g = torch.Generator().manual_seed(k)
    weight = torch.randint(-127, 128, (40, k), generator=g).float()
    weight[:, 0] = torch.where(torch.arange(40) % 2 == 0, 127.0, -127.0)  # both signs' extremes
    w = pack_w8a8(weight)
    assert torch.equal(w.scales, torch.ones(40))
    x = integer_rows(rows, k, w.group_size, seed=rows)
    exact = x.double() @ weight.double().T
    for isa in ISAS:
        assert torch.equal(w8a8_linear(w8[isa], x, w).double(), exact), isa


@pytest.mark.parametrize(("n", "k"), [(70, 576), (17, 544), (64, 128)])
@pytest.mark.parametrize("rows", [1, 4, 6, 33])
@pytest.mark.parametrize("gelu", [False, True])
def test_w8a8_avx512_matches_avx2_and_reference(w8, n: int, k: int, rows: int, gelu: bool) -> None:
    g = torch.Generator().manual_seed(n + rows)
    w = pack_w8a8(torch.randn(n, k, generator=g) * 0.05)
    x, bias = torch.randn(rows, k, generator=g), torch.randn(n, generator=g) if gelu else None
    y, y2 = w8a8_linear(w8["avx512"], x, w, bias, gelu=gelu), w8a8_linear(w8["avx2"], x, w, bias, gelu=gelu)
    assert rel(y, w8a8_linear_ref(x, w, bias, gelu)) < 1e-5 and rel(y, y2) < 1e-5


def test_w8a8_a_row_does_not_depend_on_its_batch(w8) -> None:
    w = pack_w8a8(torch.randn(49, 576, generator=torch.Generator().manual_seed(3)))
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(4))
    full = w8a8_linear(w8["avx512"], x, w)
    for rows in (slice(5, 6), slice(0, 4), slice(3, 36), slice(0, 33)):
        assert torch.equal(w8a8_linear(w8["avx512"], x[rows], w), full[rows])


def test_the_instruction_set_is_chosen_at_run_time(monkeypatch: pytest.MonkeyPatch, folder: Path, w4, w8) -> None:
    """AVX-512 where the CPU has it; SMOLGATE_CPU_ISA=avx2 forces the AVX2 kernels (for comparisons)."""
    monkeypatch.delenv(ISA_ENV, raising=False)
    assert cpu_isa() == "avx512"
    assert load_w4a8(folder) is w4["avx512"] and load_w8a8(folder) is w8["avx512"]
    monkeypatch.setenv(ISA_ENV, "avx2")
    assert cpu_isa() == "avx2" and load_w4a8(folder) is w4["avx2"] and load_w8a8(folder) is w8["avx2"]
    monkeypatch.setenv(ISA_ENV, "sse")
    with pytest.raises(ValueError, match=ISA_ENV):
        cpu_isa()
