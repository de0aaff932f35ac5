"""W4A8 GEMM on CPUs: the C kernel in w4a8.c (x86 AVX2 + FMA; w4a8_avx512.c with AVX-512 VNNI, w4a8_neon.c on aarch64
with the dot-product instructions), built once with the system C compiler.

    lib = load_w4a8(build_dir)                       # None where it cannot run: cpu_build.c_kernels_unavailable() says why
    w = pack_w4a8(q, scales, zeros)                  # once per layer: q (N, K) 0..15, w = (q - zeros) * scales
    w = pack_w4a8_terms(q, scales, zero_terms)       # or w = q * scales - zero_terms (GGUF Q4_1: zero_terms = -min)
    w = pack_w4a8_blocks(q, scales, zero_terms)      # the same, group 32, fp16 scales inline (GGUF): w4a8_blocks.h's
                                                     # octets on x86, w4a8_neon.c's 64-value blocks on aarch64
    y = w4a8_linear(lib, x, w)                       # x (M, K) float32 -> (M, N) float32
    y_ref = w4a8_linear_ref(x, w)                    # the same arithmetic in torch (tests)

Algorithm: each row of x is quantized to int8 per group of the weight's quantization (one scale per row and
group, symmetric, round to nearest), the 4-bit x 8-bit products are summed exactly in integers per group,
scaled by the weight's and the activation's scale into fp32, and the zero points are subtracted with the
exact fp32 sum of each activation group. Error against fp32 activations: ~0.4% relative per GEMM (the int8
rounding of x); a row's result is independent of the other rows of the call.

Why C and not Triton: Triton compiles for GPUs (and runs on the CPU only in its interpreter); this is the CPU
serving path. Built once with the system compiler, on torch's OpenMP threads (kernels/cpu/build.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.cpu.build import NEON_ISA, cpu_isa, load_c_kernel

SOURCE = Path(__file__).with_suffix(".c")
SOURCE_AVX512 = Path(__file__).with_name("w4a8_avx512.c")  # the same entry point on AVX-512 + VNNI
SOURCE_NEON = Path(__file__).with_name("w4a8_neon.c")  # the same entry point on aarch64 NEON + dot product
SOURCES = {"avx2": SOURCE, "avx512": SOURCE_AVX512, NEON_ISA: SOURCE_NEON}  # by build.cpu_isa()
# 64-value blocks (K a multiple of 64); int16 per-group sums of 8 half-blocks at most (see the C file); 32: half a block
GROUP_SIZES = (32, 64, 128, 256)


BLOCK_BYTES = 40  # aarch64's blocks: 32 bytes of nibbles + fp16 scales and zero terms of a 64-value block's 2 groups
# aarch64's blocks' slots (w4a8_neon.c): slot t of a 64-value block holds value BLOCK_SLOTS[t], so the 4-byte lanes
# of the unpacked nibbles alternate between the block's two groups of 32
_t = torch.arange(64)
BLOCK_SLOTS = (_t // 4 % 2) * 32 + (_t // 32) * 16 + (_t % 32 // 8) * 4 + _t % 4
OCTET_GROUP_BYTES = 160  # x86's blocks (w4a8_blocks.h): per 8 weight rows and group of 32, nibbles + 8 fp16 d + 8 fp16 z


@dataclass(frozen=True)
class W4A8Weight:
    """A weight in the kernel's layout (see w4a8.c): split (q, scales, zeros_t) or, with `blocks`, group 32 with the
    fp16 scales and zero terms inline in q (scales and zeros_t then hold them as float32, for tests and the reference,
    and are not passed to the kernel): in octets of weight rows (`octets`, w4a8_blocks.h, x86) or in 64-value blocks
    (w4a8_neon.c, aarch64)."""

    q: torch.Tensor  # (N, K / 2) uint8: per 64-value block, byte j = value j (low nibble) | value j + 32 (high)
    scales: torch.Tensor  # (N, K / G) float32
    zeros_t: torch.Tensor  # (K / G, N) float32: zero * scale, transposed
    group_size: int
    blocks: bool = False  # q is (N, K / 64 * BLOCK_BYTES) uint8 in the blocks layout
    octets: bool = False  # blocks as (N / 8, K / 32 * OCTET_GROUP_BYTES) uint8 octets (x86)
    args: tuple[int, int, int] = field(init=False)  # the kernel's pointer arguments, looked up once
    dims: tuple[int, int, int] = field(init=False)  # (N, K, G)

    def __post_init__(self) -> None:
        ptrs = (self.q.data_ptr(), 0, 0) if self.blocks else (self.q.data_ptr(), self.scales.data_ptr(), self.zeros_t.data_ptr())
        object.__setattr__(self, "args", ptrs)
        object.__setattr__(self, "dims", (*self.shape, self.group_size))

    @property
    def shape(self) -> tuple[int, int]:
        if self.octets:
            return self.q.shape[0] * 8, self.q.shape[1] // OCTET_GROUP_BYTES * 32
        if self.blocks:
            return self.q.shape[0], self.q.shape[1] // BLOCK_BYTES * 64
        return self.q.shape[0], self.q.shape[1] * 2

    def nbytes(self) -> int:
        """Bytes the kernel reads (the blocks layout's float32 copies of its scales are not among them)."""
        held = (self.q,) if self.blocks else (self.q, self.scales, self.zeros_t)
        return sum(t.numel() * t.element_size() for t in held)


def pack_w4a8(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> W4A8Weight:
    """q (N, K) integers 0..15, scales and zeros (N, K / G) with w = (q - zeros) * scales."""
    assert scales.shape == zeros.shape, "scales/zeros must be (N, K / G)"
    return pack_w4a8_terms(q, scales, zeros.float() * scales.float())


def pack_w4a8_terms(q: torch.Tensor, scales: torch.Tensor, zero_terms: torch.Tensor) -> W4A8Weight:
    """q (N, K) integers 0..15, scales and zero terms (N, K / G) with w = q * scales - zero_terms: the form GGUF's
    Q4_1 blocks take as they are (w = d q + m: zero term -m), no integer zero point needed."""
    n, k = q.shape
    group = k // scales.shape[1]
    assert scales.shape == zero_terms.shape == (n, k // group) and k % group == 0, "scales/zeros must be (N, K / G)"
    assert group in GROUP_SIZES, f"group size {group}: one of {GROUP_SIZES}"
    assert k % 64 == 0, f"in_features {k}: a multiple of 64 (the kernel's 64-value blocks)"
    blocks = q.to(torch.uint8).reshape(n, k // 64, 2, 32)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
    return W4A8Weight(packed, scales.float().contiguous(), zero_terms.float().T.contiguous(), group)


def pack_w4a8_blocks(
    q: torch.Tensor, scales: torch.Tensor, zero_terms: torch.Tensor, octets: bool | None = None
) -> W4A8Weight:
    """q (N, K) integers 0..15, scales and zero terms (N, K / 32), w = q * scales - zero_terms, every scale and zero
    term exactly an fp16 value (GGUF's Q4_0/Q4_1 blocks: d and -m), the fp16 scales and zero terms inline with the
    nibbles. octets (the default on x86): per 8 weight rows and group of 32, 128 bytes of nibbles (chunk j: int32 lane
    l is row l, its byte p values 8j + p and 8j + 4 + p) and the rows' fp16 d and z (w4a8_blocks.h; N a multiple of 8);
    else (aarch64) one 40-byte block per row and 64 values, the nibbles in the kernel's slots, then the two groups'
    fp16 scales and zero terms (w4a8_neon.c)."""
    n, k = q.shape
    assert scales.shape == zero_terms.shape == (n, k // 32), "scales/zero terms must be (N, K / 32)"
    assert k % 64 == 0, f"in_features {k}: a multiple of 64 (the kernel's 64-value blocks)"
    d, z = scales.float(), zero_terms.float()
    assert torch.equal(d.half().float(), d) and torch.equal(z.half().float(), z), "scales/zero terms must be fp16 values"
    octets = cpu_isa() != NEON_ISA if octets is None else octets
    if octets:
        assert n % 8 == 0, f"out_features {n}: a multiple of 8 (the kernel's octets of weight rows)"
        v = q.to(torch.uint8).reshape(n // 8, 8, k // 32, 4, 8)  # (octet, row, group, chunk, value)
        nibbles = (v[..., :4] | (v[..., 4:] << 4)).permute(0, 2, 3, 1, 4).reshape(n // 8, k // 32, 128)
        halves = [t.half().reshape(n // 8, 8, k // 32).transpose(1, 2).contiguous().view(torch.uint8) for t in (d, z)]
        packed = torch.cat([nibbles, *halves], dim=2).reshape(n // 8, -1).contiguous()
        return W4A8Weight(packed, d.contiguous(), z.T.contiguous(), 32, blocks=True, octets=True)
    slots = q.to(torch.uint8).reshape(n, k // 64, 64)[:, :, BLOCK_SLOTS]
    nibbles = slots[:, :, :32] | (slots[:, :, 32:] << 4)  # (N, blocks, 32)
    block_halves = torch.cat([t.half().reshape(n, k // 64, 2) for t in (d, z)], dim=2)  # (N, blocks, [d0, d1, z0, z1])
    packed = torch.cat([nibbles, block_halves.view(torch.uint8)], dim=2).reshape(n, -1).contiguous()
    return W4A8Weight(packed, d.contiguous(), z.T.contiguous(), 32, blocks=True)


def unpack_w4a8(w: W4A8Weight) -> torch.Tensor:
    """(N, K) uint8 values back out of the packed layout."""
    n, k = w.shape
    if w.octets:
        b = w.q.reshape(n // 8, k // 32, OCTET_GROUP_BYTES)[:, :, :128].reshape(n // 8, k // 32, 4, 8, 4)
        values = torch.cat([b & 15, b >> 4], dim=4)  # (octet, group, chunk, row, value)
        return values.permute(0, 3, 1, 2, 4).reshape(n, k)
    if w.blocks:
        b = w.q.reshape(n, k // 64, BLOCK_BYTES)[:, :, :32]
        slots = torch.cat([b & 15, b >> 4], dim=2)  # (N, blocks, 64) in slot order
        return torch.empty_like(slots).index_copy_(2, BLOCK_SLOTS, slots).reshape(n, k)
    b = w.q.reshape(n, k // 64, 32)
    return torch.stack([b & 15, b >> 4], dim=2).reshape(n, k)


def w4a8_linear(lib: ctypes.CDLL, x: torch.Tensor, w: W4A8Weight) -> torch.Tensor:
    """y = x @ dequant(w).T with x quantized per (row, group) to int8; x (M, K) float32 -> (M, N) float32."""
    n, k, group = w.dims
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, f"x must be (M, {k}) with unit column stride"
    assert x.dtype == torch.float32 and x.device.type == "cpu", "x must be a float32 CPU tensor"
    m = x.shape[0]
    y = torch.empty(m, n)
    if lib.w4a8_linear(x.data_ptr(), x.stride(0), *w.args, m, n, k, group, y.data_ptr(), torch.get_num_threads()):
        raise MemoryError(f"w4a8_linear: no memory for the quantized activations ({m} x {k})")
    return y


def quantize_rows_ref(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (M, K) -> int8 values (M, K), scales (M, K / G), exact sums (M, K / G): the kernel's activation step."""
    g = x.float().reshape(x.shape[0], -1, group)  # (M, groups, G)
    amax = g.abs().amax(-1)
    # a tensor over a tensor: torch computes `127.0 / amax` as 127 * reciprocal(amax), which can be an ulp off the C
    # kernels' correctly rounded 127.f / a and flip a near-tie's rounding (seen on the NEON harness's inputs)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    xq = torch.round(g * inv[..., None]).to(torch.int8).reshape(x.shape)
    return xq, amax / 127.0, g.sum(-1)


def w4a8_linear_ref(x: torch.Tensor, w: W4A8Weight) -> torch.Tensor:
    """The kernel's arithmetic in torch (float64 accumulation: the kernel's fp32 order is not reproduced)."""
    n = w.shape[0]
    xq, xd, xs = quantize_rows_ref(x, w.group_size)
    q = unpack_w4a8(w).double().reshape(n, -1, w.group_size)  # (N, groups, G)
    dots = torch.einsum("mgk,ngk->mng", xq.double().reshape(x.shape[0], -1, w.group_size), q)  # (M, N, groups)
    y = (dots * w.scales.double()[None] * xd.double()[:, None]).sum(-1)
    return (y - xs.double() @ w.zeros_t.double()).float()


# ---- loading -------------------------------------------------------------------------------------------
def load_w4a8(build_dir: Path, isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel (built on first use into `build_dir`, kernels/cpu/build.py), or None where it cannot run.
    isa: "avx2" (w4a8.c), "avx512" (w4a8_avx512.c) or "neon-dotprod" (w4a8_neon.c, aarch64); by default the best this
    CPU runs (build.cpu_isa)."""
    lib = load_c_kernel(SOURCES[isa or cpu_isa()], Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.w4a8_linear.argtypes = [p, i64, p, p, p, i64, i64, i64, i64, p, ctypes.c_int]
        lib.w4a8_linear.restype = ctypes.c_int
    return lib
