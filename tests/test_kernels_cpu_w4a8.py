"""The W4A8 CPU kernel (kernels/cpu/w4a8.c, and w4a8_avx512.c where the CPU has AVX-512 VNNI) against its torch
reference and a float32 matmul, and Int4Linear's w4a8 mode. Skipped, saying why, where the kernel cannot be built (not
x86 AVX2, no C compiler)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from backend.quant.awq_format import pack, quantize
from backend.quant.convert import w4a8_kernel
from backend.quant.cpu_gemm import dense_dtype
from backend.quant.int4_linear import Int4Linear, dequantized_weight
from kernels.cpu.w4a8 import (
    BLOCK_SLOTS,
    load_w4a8,
    pack_w4a8,
    pack_w4a8_blocks,
    pack_w4a8_terms,
    quantize_rows_ref,
    unpack_w4a8,
    w4a8_linear,
    w4a8_linear_ref,
)
from tests.c_kernels import ISAS, assert_rows_invariant_on_every_isa, build, requires_c_kernels

pytestmark = requires_c_kernels


@pytest.fixture(scope="module", params=ISAS)
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Each instruction set's kernel this CPU runs (w4a8.c, w4a8_avx512.c)."""
    return build(partial(load_w4a8, isa=request.param), tmp_path_factory, f"w4a8-{request.param}")


def random_weight(n: int, k: int, group: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 1e-3
    zeros = torch.randint(0, 16, (n, k // group), generator=g).float()
    return q, scales, zeros


def dense(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    n, k = q.shape
    return ((q.float().view(n, scales.shape[1], -1) - zeros[..., None]) * scales[..., None]).view(n, k)


def test_pack_roundtrip_and_layout() -> None:
    q, scales, zeros = random_weight(8, 128, 64)
    w = pack_w4a8(q, scales, zeros)
    assert w.q.shape == (8, 64) and w.zeros_t.shape == (2, 8)
    assert torch.equal(unpack_w4a8(w), q)
    assert w.q[0, 33].item() == q[0, 65].item() | (q[0, 97].item() << 4)  # byte j: values j and j + 32 of its block


@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("rows", [1, 3, 4, 9, 32, 70])  # the 4-row tile, its tails, several 32-row blocks
def test_matches_reference_and_float_matmul(lib, group: int, rows: int) -> None:
    n, k = 40, 512  # 40 weight rows: two chunks of 16 plus a tail of 8
    q, scales, zeros = random_weight(n, k, group, seed=group)
    w = pack_w4a8(q, scales, zeros)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    y = w4a8_linear(lib, x, w)
    ref = w4a8_linear_ref(x, w)
    assert y.shape == (rows, n) and y.dtype == torch.float32
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5  # the same arithmetic, fp32 summation order aside
    exact = x @ dense(q, scales, zeros).T
    assert ((y - exact).norm() / exact.norm()).item() < 0.02  # what int8 activations cost


@pytest.mark.parametrize("group", [32, 64])
def test_a_row_does_not_depend_on_its_batch(lib, group: int) -> None:
    q, scales, zeros = random_weight(48, 256, group)
    w = pack_w4a8(q, scales, zeros)
    x = torch.randn(37, 256)
    full = w4a8_linear(lib, x, w)
    for rows in (slice(5, 6), slice(0, 4), slice(3, 36), slice(0, 33)):
        assert torch.equal(w4a8_linear(lib, x[rows], w), full[rows])


def test_zero_rows_and_outlier_groups(lib) -> None:
    q, scales, zeros = random_weight(16, 128, 64)
    w = pack_w4a8(q, scales, zeros)
    x = torch.zeros(3, 128)
    x[1, 5] = 1e4  # one outlier costs precision only in its own group
    x[1, 64:] = torch.randn(64)
    y = w4a8_linear(lib, x, w)
    assert torch.equal(y[0], torch.zeros(16)) and torch.equal(y[2], torch.zeros(16))
    exact = x @ dense(q, scales, zeros).T
    assert torch.allclose(y[1], exact[1], rtol=1e-3, atol=1e-3 * exact[1].abs().max().item())


def test_quantize_rows_ref_round_trip() -> None:
    x = torch.randn(4, 128)
    xq, xd, xs = quantize_rows_ref(x, 64)
    back = (xq.float().view(4, 2, 64) * xd[..., None]).view(4, 128)
    assert (back - x).abs().max() <= xd.max() / 2 + 1e-6
    assert torch.allclose(xs, x.view(4, 2, 64).sum(-1))


def test_launcher_checks_shapes(lib) -> None:
    w = pack_w4a8(*random_weight(16, 64, 64))
    with pytest.raises(AssertionError, match="must be"):
        w4a8_linear(lib, torch.randn(2, 32), w)
    with pytest.raises(AssertionError, match="float32"):
        w4a8_linear(lib, torch.randn(2, 64, dtype=torch.float64), w)
    with pytest.raises(AssertionError, match="group size"):
        pack_w4a8(*random_weight(16, 64, 16))
    with pytest.raises(AssertionError, match="multiple of 64"):
        pack_w4a8(*random_weight(16, 96, 32))


@pytest.mark.parametrize("rows", [1, 5, 33])
def test_zero_terms_of_gguf_blocks(lib, rows: int) -> None:
    """Group 32 with a float zero term per block (GGUF Q4_1: w = d q + m), against the exact fp32 matmul and the
    kernel's reference; the 32-value groups are the two halves of each 64-value block."""
    n, k = 24, 384
    g = torch.Generator().manual_seed(7)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = -(torch.rand(n, k // 32, generator=g) * 0.15).half().float()
    w = pack_w4a8_terms(q, d, -m)
    assert w.group_size == 32 and torch.equal(unpack_w4a8(w), q)
    weight = (q.float().view(n, -1, 32) * d[..., None] + m[..., None]).view(n, k)
    x = torch.randn(rows, k, generator=g)
    y = w4a8_linear(lib, x, w)
    ref = w4a8_linear_ref(x, w)
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5
    exact = x @ weight.T
    assert ((y - exact).norm() / exact.norm()).item() < 0.02


def q4_1_blocks(n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random Q4_1-like blocks: values 0..15, fp16 scales d and minimums m per group of 32 (w = d q + m)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = -(torch.rand(n, k // 32, generator=g) * 0.15).half().float()
    return q, d, m


def test_blocks_layout_octets() -> None:
    """x86's blocks layout byte by byte: per 8 weight rows and group of 32, 160 bytes: four 32-byte chunks of nibbles
    (int32 lane l is row l, its byte p values 8j + p, low nibble, and 8j + 4 + p, high), then the eight rows' fp16
    scales and zero terms as they were given."""
    q, d, m = q4_1_blocks(16, 128, seed=1)
    w = pack_w4a8_blocks(q, d, -m, octets=True)
    assert w.blocks and w.octets and w.group_size == 32 and w.shape == (16, 128) and w.q.shape == (2, 4 * 160)
    assert w.nbytes() == 16 * 128 * 5 // 8 and w.args[1:] == (0, 0)  # 5 bits a weight; no separate scales
    assert torch.equal(unpack_w4a8(w), q)
    group = w.q[1, 2 * 160 : 3 * 160]  # rows 8..15, values 64..95
    # chunk 3, row 8 + 5, byte 2: values 64 + 24 + 2 (low nibble) and 64 + 28 + 2 (high)
    assert group[3 * 32 + 5 * 4 + 2].item() == q[13, 90].item() | (q[13, 94].item() << 4)
    assert torch.equal(group[128:144].view(torch.float16).float(), d[8:16, 2])
    assert torch.equal(group[144:].view(torch.float16).float(), -m[8:16, 2])
    with pytest.raises(AssertionError, match="fp16 values"):
        pack_w4a8_blocks(q, d + 1e-7, -m)
    with pytest.raises(AssertionError, match="multiple of 8"):
        pack_w4a8_blocks(q[:12], d[:12], -m[:12], octets=True)


def test_blocks_layout_neon() -> None:
    """aarch64's blocks layout (w4a8_neon.c) byte by byte: 40 bytes per row and 64 values, nibbles in the kernel's
    slots, then the two groups' fp16 scales and zero terms as they were given."""
    q, d, m = q4_1_blocks(3, 128, seed=1)
    w = pack_w4a8_blocks(q, d, -m, octets=False)
    assert w.blocks and not w.octets and w.group_size == 32 and w.shape == (3, 128) and w.q.shape == (3, 2 * 40)
    assert w.nbytes() == 3 * 2 * 40 and w.args[1:] == (0, 0)  # the kernel gets no separate scales
    assert torch.equal(unpack_w4a8(w), q)
    block = w.q[2, 40:80]  # row 2, values 64..127 (groups 2 and 3)
    # slot 4: value 32 (the second group's first); byte 13: slots 13 (value 32 + 4 + 1) and 45 (32 + 16 + 4 + 1)
    assert BLOCK_SLOTS[4].item() == 32 and BLOCK_SLOTS[13].item() == 37 and BLOCK_SLOTS[45].item() == 53
    assert block[13].item() == q[2, 64 + 37].item() | (q[2, 64 + 53].item() << 4)
    halves = block[32:].view(torch.float16).float()
    assert torch.equal(halves, torch.stack([d[2, 2], d[2, 3], -m[2, 2], -m[2, 3]]))


def blocks_reference(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The blocks kernel's arithmetic in plain torch (float64), from the unpacked values: x quantized per row and group
    of 32 to int8, exact integer dot products per group, y = sum_g d xd dot - z xs."""
    rows, (n, k) = x.shape[0], q.shape
    g = x.double().view(rows, k // 32, 32)
    amax = g.abs().amax(-1)
    xq = torch.round(g * torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))[..., None])
    dots = torch.einsum("mgk,ngk->mng", xq, q.double().view(n, k // 32, 32))  # exact: small integers
    return ((dots * (d.double()[None] * (amax / 127)[:, None])).sum(-1) - g.sum(-1) @ z.double().T).float()


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 9, 32, 70])  # the 4-row tiles, their tails, several 32-row blocks
def test_blocks_layout_against_torch(lib, rows: int) -> None:
    """Group 32 in the blocks layout (GGUF Q4_1: w = d q + m, zero term -m): against the same arithmetic in plain
    torch, the split layout's kernel (fp32 rounding apart) and the exact fp32 matmul (int8 activations' error)."""
    n, k = 40, 576  # five octets (AVX-512's two-octet tile and its tail), three chunks of 16 rows, SmolLM2's K
    q, d, m = q4_1_blocks(n, k, seed=rows)
    w = pack_w4a8_blocks(q, d, -m)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    y = w4a8_linear(lib, x, w)
    ref = blocks_reference(x, q, d, -m)
    assert y.shape == (rows, n) and ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5
    split = w4a8_linear(lib, x, pack_w4a8_terms(q, d, -m))
    assert ((y - split).abs().max() / split.abs().max()).item() < 1e-5
    exact = x @ (q.float().view(n, -1, 32) * d[..., None] + m[..., None]).view(n, k).T
    assert ((y - exact).norm() / exact.norm()).item() < 0.02


def test_blocks_layout_rows_do_not_depend_on_their_batch_or_the_isa(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every row of a blocks-layout call equals the row alone, bit for bit, on each instruction set; and the AVX2 and
    AVX-512 kernels give the same bits (each int32 lane holds one output's exact group sum on both)."""
    q, d, m = q4_1_blocks(40, 192, seed=3)
    x = torch.randn(38, 192, generator=torch.Generator().manual_seed(5))
    assert_rows_invariant_on_every_isa(load_w4a8, w4a8_linear, pack_w4a8_blocks(q, d, -m), x, tmp_path_factory, "w4a8-blocks")


@pytest.mark.parametrize("rows", [1, 32, 200])
def test_int4_linear_w4a8_mode(lib, rows: int) -> None:
    """An AWQ layer prepared with the kernel: only the 4-bit copy, within 2% of the dequantized fp32 matmul."""
    torch.manual_seed(rows)  # the data, whatever ran before (the int8 activations' error is ~1.5-2% of the norm)
    layer = Int4Linear(256, 128, 64, bias=True)
    for name, t in pack(quantize(torch.randn(128, 256) * 0.05, 64)).items():
        getattr(layer, name).data = t
    layer.bias.data = torch.randn(128)
    weight, bias = dequantized_weight(layer), layer.bias.data.clone()
    layer.prepare(w4a8=lib)
    assert layer.mode == "w4a8" and not hasattr(layer, "dense") and not hasattr(layer, "packed")
    assert layer.weight_bytes() <= 128 * 256 * 2 * 0.32  # 4 bits + fp32 (scale, zero * scale) per 64 weights
    x = torch.randn(rows, 256)
    ref = x @ weight.T + bias
    y = layer(x.view(rows, 1, 256))
    assert y.shape == (rows, 1, 128)
    assert ((y.view(rows, 128) - ref).norm() / ref.norm()).item() < 0.02


def test_the_engine_s_choice_of_kernel() -> None:
    """auto: the kernel wherever it builds when deterministic (the default: its rows are batch-invariant), else on
    CPUs without native bf16 (where it was measured); torch: never; w4a8: required."""
    assert w4a8_kernel("torch") is None and w4a8_kernel("torch", deterministic=True) is None
    auto = w4a8_kernel("auto")
    assert (auto is not None) == (dense_dtype("cpu") == torch.float32)
    assert w4a8_kernel("auto", deterministic=True) is not None
    assert w4a8_kernel("w4a8") is not None
    with pytest.raises(ValueError, match="unknown int4_cpu_kernel"):
        w4a8_kernel("int3")
