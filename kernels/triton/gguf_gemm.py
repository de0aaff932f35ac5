"""Grouped-int8 GEMM: a GGUF file's blocks served in their own bits on a GPU, y = x @ W^T with W dequantized per tile.

The weight is kernels/cpu/wg8a8.py's GroupedInt8 (what backend/quant/gguf_types.py decodes every served block type to:
Q4_0 ... Q8_0, the K-quants), copied once at load time into a column layout (`columns`, `GroupedColumns`):
    qt        (K, N) int8          q transposed: the N columns of one input row contiguous, so a [BLOCK_K, BLOCK_N]
                                   tile is read in whole lines along N (the CPU's octets of rows would not coalesce)
    scales_t  (K / G, N) float32   G = 16 (Q3_K, Q6_K) or 32 (the rest); one row of a group's scales is contiguous too
    zeros_t   (K / 32, N) float32  the term added per group of 32 (types with a minimum), or None
    w[n, k] = scales_t[k // G, n] * qt[k, n] (+ zeros_t[k // 32, n])    (the values GroupedInt8.dequantized() gives)
The same bytes as the CPU's layout: 1.125-1.375 a weight (q, plus 4 / G for the scales, 4 / 32 for the terms).

Algorithm: two kinds (`GroupedConfig.kind`), one chosen per M
    mma   Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), split_k). The K loop steps one scale group (G inputs) at a time:
          x tile [BLOCK_M, G], q tile [G, BLOCK_N] cast to x's dtype (exact: |q| <= 128 fits fp16's and bf16's
          significands), part = x @ q by tl.dot in fp32, then acc += part * s[None, :] (+ rowsum(x) * z[None, :]: the
          group's term times the exact sum of its inputs). The weights are never rounded to x's dtype: the products
          are x times the file's integers, scaled in fp32.
    gemv  Grid (M, cdiv(N, BLOCK_N), split_k): one row of x per program (decode, a few rows). Per K tile of BLOCK_K
          inputs (a multiple of 32) the weight as a float32 [BLOCK_K / G, G, BLOCK_N] tile, w = s * q (+ z), products
          accumulated per (k, column) and summed over K once at the end (no MMA tile padded from 1 row to 16).
    split_k > 1 (too few output tiles to fill the GPU) writes fp32 partials, summed after in a fixed order.

Tiles per M (`default_config`): gemv up to DECODE_ROWS rows, mma tiles of up to 64 rows above. Within one M bucket (the
power of two at or above M) the configuration and the split do not depend on M, so a row's result does not depend on
how many rows share the call. No tuner yet: `bench.gpu`'s gemm section times both kinds against cuBLAS on the
dequantized weight, and its figures are what to tune by.

Limits: K a multiple of 32, G 16 or 32; x (M, K) float16 / bfloat16 / float32 with a contiguous last dim; no bias.
"""

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from kernels.cpu.wg8a8 import GroupedInt8
from kernels.triton._utils import check_device, dot_upcast, mma, multi_processor_count

TERM_GROUP = 32  # the zero terms' group (GroupedInt8's), whatever the scales' G
DECODE_ROWS = 4  # up to this many rows of x, one program per row (gemv); above, MMA tiles


@triton.jit
def _gguf_gemm_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, k_per_split,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ZEROS: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, GROUP):  # one scale group a step: K and the split are multiples of 32
        offs_k = k0 + tl.arange(0, GROUP)
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :], mask=m_mask[:, None],
                    other=0.0)
        q = tl.load(q_ptr + offs_k[:, None].to(tl.int64) * N + offs_n[None, :], mask=n_mask[None, :], other=0)
        # UPCAST (bf16 under the interpreter, which holds bf16 as raw uint16 and casts int8 to it wrongly): via fp32
        qx = q.to(tl.float32) if UPCAST else q.to(x.dtype)
        part = mma(x, qx, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST)
        sc = tl.load(s_ptr + (k0 // GROUP) * N + offs_n, mask=n_mask, other=0.0)
        acc += part * sc[None, :]
        if ZEROS:  # sum_k x[m, k] z[n, k // 32] over this group: the group's term times its inputs' sum
            zt = tl.load(z_ptr + (k0 // 32) * N + offs_n, mask=n_mask, other=0.0)
            acc += tl.sum(x.to(tl.float32), axis=1)[:, None] * zt[None, :]
    out_ptrs = out_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _gguf_gemv_kernel(
    x_ptr, q_ptr, s_ptr, z_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, k_per_split,
    GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ZEROS: tl.constexpr,
):
    """One row of x per program: w = s * q (+ z) in float32 as [groups, GROUP, BLOCK_N] tiles (the group on its own
    axis, so a scale row broadcasts without a reshape), x * w accumulated per element, summed over K at the end."""
    row = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    groups = tl.arange(0, BLOCK_K // GROUP)
    within = tl.arange(0, GROUP)
    acc = tl.zeros([BLOCK_K // GROUP, GROUP, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):  # whole tiles: K and the split are multiples of BLOCK_K
        first = k0 + groups * GROUP  # each group's first input
        offs_k = first[:, None] + within[None, :]  # [groups, GROUP]
        xk = tl.load(x_ptr + row * stride_xm + offs_k).to(tl.float32)
        q = tl.load(q_ptr + offs_k[:, :, None].to(tl.int64) * N + offs_n[None, None, :], mask=n_mask[None, None, :],
                    other=0)
        sc = tl.load(s_ptr + (first // GROUP)[:, None].to(tl.int64) * N + offs_n[None, :], mask=n_mask[None, :],
                     other=0.0)
        w = sc[:, None, :] * q.to(tl.float32)
        if ZEROS:
            zt = tl.load(z_ptr + (first // 32)[:, None].to(tl.int64) * N + offs_n[None, :], mask=n_mask[None, :],
                         other=0.0)
            w += zt[:, None, :]
        acc += xk[:, :, None] * w
    y = tl.sum(tl.sum(acc, axis=0), axis=0)
    tl.store(out_ptr + pid_k.to(tl.int64) * M * N + row * stride_om + offs_n, y.to(out_ptr.dtype.element_ty),
             mask=n_mask)


KINDS = ("mma", "gemv")


@dataclass(frozen=True)
class GroupedConfig:
    """One way to run a shape. kind: mma (tl.dot tiles of block_m rows, K one group a step) or gemv (one row per
    program, K tiles of block_k inputs, a multiple of 32; block_m unused). split_k None: enough K slices for ~2
    programs per SM on a GPU (counted from M's bucket, not M), 1 elsewhere."""

    kind: str
    block_m: int
    block_n: int
    block_k: int = 64
    split_k: int | None = None
    num_warps: int = 4
    num_stages: int = 3

    def label(self) -> str:
        split = "auto" if self.split_k is None else self.split_k
        return f"{self.kind}_m{self.block_m}n{self.block_n}k{self.block_k}s{split}_{self.num_warps}x{self.num_stages}"


def m_bucket(m: int) -> int:
    """The power of two at or above M: calls in one bucket share a tile configuration."""
    return triton.next_power_of_2(max(1, m))


def default_config(m: int) -> GroupedConfig:
    """Decode (up to DECODE_ROWS rows): one program per row over 128 columns and 64 inputs a step; else MMA tiles of
    up to 64 rows by 64 columns."""
    bucket = m_bucket(m)
    if bucket <= DECODE_ROWS:
        return GroupedConfig("gemv", 1, 128, 64)
    return GroupedConfig("mma", min(64, max(16, bucket)), 64)


def _launch(x, qt, scales_t, zeros_t, out, cfg: GroupedConfig):
    M, K = x.shape
    N = qt.shape[1]
    group = K // scales_t.shape[0]
    assert cfg.kind in KINDS, cfg
    assert cfg.block_n >= 16 and cfg.block_n & (cfg.block_n - 1) == 0 and cfg.block_k % TERM_GROUP == 0, cfg
    # the K step: one group (mma), or the largest of block_k, 64, 32 that divides K (gemv's tiles have no K mask)
    step = group if cfg.kind == "mma" else next(b for b in (cfg.block_k, 64, 32) if K % b == 0)
    tiles = (triton.cdiv(m_bucket(M), cfg.block_m) if cfg.kind == "mma" else m_bucket(M)) * triton.cdiv(N, cfg.block_n)
    split_k = cfg.split_k
    if split_k is None:
        split_k = 1
        if x.device.type == "cuda":
            split_k = max(1, min(triton.cdiv(2 * multi_processor_count(x.device), tiles), K // 64, 16))
    # each slice a whole number of K steps and of the terms' groups
    align = max(step, TERM_GROUP)
    k_per_split = triton.cdiv(K // align, split_k) * align
    split_k = triton.cdiv(K, k_per_split)
    target = out if split_k == 1 else torch.empty(split_k, M, N, dtype=torch.float32, device=x.device)
    zeros = zeros_t if zeros_t is not None else scales_t  # never read without ZEROS
    common = (x, qt, scales_t, zeros, target, M, N, K, x.stride(0), N if split_k > 1 else out.stride(0), k_per_split)
    if cfg.kind == "gemv":
        _gguf_gemv_kernel[(M, triton.cdiv(N, cfg.block_n), split_k)](
            *common, GROUP=group, BLOCK_N=cfg.block_n, BLOCK_K=step, ZEROS=zeros_t is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    else:
        _gguf_gemm_kernel[(triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n), split_k)](
            *common, GROUP=group, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, ZEROS=zeros_t is not None,
            UPCAST=dot_upcast(_gguf_gemm_kernel, x.dtype), num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )
    if split_k > 1:
        out.copy_(target.sum(dim=0))
    return out


def gguf_gemm(x, qt, scales_t, zeros_t=None, *, out=None, config: GroupedConfig | None = None):
    """y = x @ W^T for a grouped-int8 W in the column layout (`columns`); x (M, K) -> (M, N) in x's dtype.
    Tiles: `config`, else `default_config(M)`."""
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    M, K = x.shape
    assert qt.dtype == torch.int8 and qt.dim() == 2 and qt.shape[0] == K and qt.is_contiguous(), (qt.dtype, qt.shape, K)
    N = qt.shape[1]
    assert K % TERM_GROUP == 0, f"K must be a multiple of 32, got {K}"
    assert scales_t.dtype == torch.float32 and scales_t.is_contiguous() and scales_t.dim() == 2, scales_t.dtype
    assert scales_t.shape[1] == N and K // scales_t.shape[0] in (16, 32) and K % scales_t.shape[0] == 0, scales_t.shape
    if zeros_t is not None:
        assert zeros_t.dtype == torch.float32 and zeros_t.shape == (K // TERM_GROUP, N) and zeros_t.is_contiguous(), \
            (zeros_t.dtype, zeros_t.shape)
    assert x.dtype in (torch.float16, torch.bfloat16, torch.float32), x.dtype
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (M, N) and out.dtype == x.dtype and out.stride(1) == 1, (out.shape, out.dtype)
    check_device(_gguf_gemm_kernel, *(t for t in (x, qt, scales_t, zeros_t, out) if t is not None))
    if M == 0:
        return out
    return _launch(x, qt, scales_t, zeros_t, out, config or default_config(M))


# ---- the layout, and the torch reference ----

@dataclass(frozen=True)
class GroupedColumns:
    """A GroupedInt8 in the kernel's column layout on its device (the only copy a layer keeps there)."""

    qt: torch.Tensor  # (K, N) int8
    scales_t: torch.Tensor  # (K / G, N) float32
    zeros_t: torch.Tensor | None  # (K / 32, N) float32
    group: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "group", self.qt.shape[0] // self.scales_t.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qt.shape[1], self.qt.shape[0])

    @property
    def zeros(self) -> torch.Tensor | None:  # what the layers' descriptions read (PackedGrouped's name)
        return self.zeros_t

    def nbytes(self) -> int:
        return self.qt.numel() + 4 * (self.scales_t.numel() + (0 if self.zeros_t is None else self.zeros_t.numel()))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 (len(ids), K) on the weight's device: those rows' values (an embedding lookup), bit for bit
        GroupedInt8.dequantized()'s."""
        z = None if self.zeros_t is None else self.zeros_t[:, ids].T.contiguous()
        return GroupedInt8(self.qt[:, ids].T.contiguous(), self.scales_t[:, ids].T.contiguous(), z).dequantized()

    def dequantized(self) -> torch.Tensor:
        return self.rows(torch.arange(self.shape[0], device=self.qt.device))


def columns(g: GroupedInt8, device: torch.device | str) -> GroupedColumns:
    """g in the kernel's layout on `device` (moved first, then transposed there)."""
    z = None if g.zeros is None else g.zeros.to(device).T.contiguous()
    return GroupedColumns(g.q.to(device).T.contiguous(), g.scales.to(device).T.contiguous(), z)


def gguf_gemm_ref(x: torch.Tensor, g: GroupedInt8) -> torch.Tensor:
    """Torch reference: W dequantized in float64 (s * q + z), x @ W^T in float64; the result in x's dtype."""
    n, k = g.q.shape
    w = g.scales.double().repeat_interleave(g.group, dim=1) * g.q.double()
    if g.zeros is not None:
        w = w + g.zeros.double().repeat_interleave(TERM_GROUP, dim=1)
    assert w.shape == (n, k)
    return (x.double() @ w.T.to(x.device)).to(x.dtype)
