"""W4A16 GEMM for AutoAWQ's "GEMM" layout: y = x @ dequant(qweight, qzeros, scales), dequantised in tiles.

Layout (AutoAWQ ``WQLinear_GEMM``, w_bit 4, K = in_features, N = out_features)
    qweight:  (K, N / 8) int32. Word c of row k packs columns 8c..8c+7: nibble i (bits 4i..4i+3) holds
              column 8c + AWQ_ORDER[i], AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]; so column 8c + j is in nibble
              AWQ_REVERSE_ORDER[j] = [0, 4, 1, 5, 2, 6, 3, 7][j] = j // 2 + 4 * (j % 2).
    qzeros:   (K / group_size, N / 8) int32, the same packing, zero points 0..15 (stored as is, not minus 1).
    scales:   (K / group_size, N) float16.
    w[k, n] = (q[k, n] - z[k // group_size, n]) * s[k // group_size, n].
    Or, with ``zero_terms`` (K / group_size, N) float instead of qzeros (a GGUF file's Q4_0/Q4_1 blocks:
    backend/quant/gguf_blocks.py, whose Q4_1 minimum m is no integer multiple of the scale):
    w[k, n] = q[k, n] * s[k // group_size, n] - zero_terms[k // group_size, n].

Algorithm
    Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N), SPLIT_K). A program owns an output tile and a slice of K.
    Per K tile (BLOCK_K rows, inside one quantisation group since group_size % BLOCK_K == 0):
        x tile [BLOCK_M, BLOCK_K]; qweight tile as [BLOCK_K, BLOCK_N] int32 (column n reads word n // 8: the
        8 lanes of one word hit the same address, one memory transaction), nibble = (word >> shift(n)) & 15;
        one row of zeros and scales for the group; w = (nibble - zero) * scale in fp32, cast to x's dtype;
        acc += x @ w with tl.dot (fp32 accumulation).
    SPLIT_K > 1 (small M: too few output tiles to fill the GPU) writes fp32 partials that are summed after.

Limits
    4-bit only; group_size in {32, 64, 128} (any multiple of BLOCK_K works); N a multiple of 8; x
    (M, K) with a contiguous last dim in float16/bfloat16 (float32 accepted for testing); no bias (add it
    outside); no act-order / g_idx (that is GPTQ, not AWQ).
"""

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device, dot_upcast, mma, multi_processor_count

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]


@triton.jit
def _awq_gemm_kernel(
    x_ptr, qw_ptr, qz_ptr, s_ptr, out_ptr,
    M, N, K, stride_xm, stride_om, stride_qw, stride_qz, stride_s, group_size, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    UPCAST: tl.constexpr, FLOAT_ZERO: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # 1. Where each output column's nibble sits in its packed word (AWQ's interleaved order).
    j = offs_n % 8
    shifts = (j // 2 + (j % 2) * 4) * 4
    word = offs_n // 8
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    for k0 in range(k_start, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        # 2. Activations and packed weights of this K tile.
        x = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :], mask=m_mask[:, None],
                    other=0.0)
        qw = tl.load(qw_ptr + offs_k[:, None].to(tl.int64) * stride_qw + word[None, :], mask=n_mask[None, :],
                     other=0)
        # 3. The group's zero points and scales (one row: the tile lies inside one group).
        grp = k0 // group_size
        sc = tl.load(s_ptr + grp * stride_s + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        # 4. Unpack, subtract the zero point, scale: the dequantised tile in x's dtype, then the MMA.
        q = (qw >> shifts[None, :]) & 0xF
        if FLOAT_ZERO:  # qz_ptr holds float zero terms, one per column: w = q * s - zt
            zt = tl.load(qz_ptr + grp * stride_qz + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            w = (q.to(tl.float32) * sc[None, :] - zt[None, :]).to(x.dtype)
        else:
            qz = tl.load(qz_ptr + grp * stride_qz + word, mask=n_mask, other=0)
            z = (qz >> shifts) & 0xF
            w = ((q - z[None, :]).to(tl.float32) * sc[None, :]).to(x.dtype)
        acc = mma(x, w, acc, UPCAST)
    out_ptrs = out_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None].to(tl.int64) * stride_om
    out_ptrs += offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def awq_gemm(x, qweight, qzeros, scales, group_size: int, out=None, split_k: int | None = None,
             block_m: int | None = None, block_n: int = 64, block_k: int | None = None, zero_terms=None):
    """y = x @ W for an AWQ-packed W (K, N); x (M, K) -> (M, N) in x's dtype. `zero_terms` (K / group_size, N) float
    replaces qzeros (then None): w = q * scale - zero_term."""
    assert x.dim() == 2 and x.stride(1) == 1, (x.shape, x.stride())
    M, K = x.shape
    assert qweight.dtype == torch.int32 and qweight.dim() == 2 and qweight.shape[0] == K, (qweight.dtype, qweight.shape, K)
    assert qweight.is_contiguous(), qweight.stride()
    N = qweight.shape[1] * 8
    assert K % group_size == 0, (K, group_size)
    if zero_terms is not None:
        assert qzeros is None, "zero_terms replace qzeros"
        assert zero_terms.shape == (K // group_size, N) and zero_terms.is_contiguous(), zero_terms.shape
        assert zero_terms.dtype in (torch.float16, torch.bfloat16, torch.float32), zero_terms.dtype
        qzeros = zero_terms  # the kernel reads them through the zero points' pointer (FLOAT_ZERO)
    else:
        assert qzeros.dtype == torch.int32, qzeros.dtype
        assert qzeros.shape == (K // group_size, N // 8) and qzeros.is_contiguous(), qzeros.shape
    assert scales.shape == (K // group_size, N) and scales.is_contiguous(), scales.shape
    assert scales.dtype in (torch.float16, torch.bfloat16, torch.float32), scales.dtype
    assert x.dtype in (torch.float16, torch.bfloat16, torch.float32), x.dtype
    block_k = min(group_size, 64) if block_k is None else block_k
    block_m = min(64, max(16, triton.next_power_of_2(M))) if block_m is None else block_m
    assert group_size % block_k == 0 and block_k >= 16, (group_size, block_k)
    assert block_n % 8 == 0 and block_n >= 16 and block_m >= 16, (block_m, block_n)
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    assert out.shape == (M, N) and out.dtype == x.dtype and out.stride(1) == 1, (out.shape, out.dtype)
    check_device(_awq_gemm_kernel, x, qweight, qzeros, scales, out)
    if M == 0:
        return out
    tiles = triton.cdiv(M, block_m) * triton.cdiv(N, block_n)
    if split_k is None:
        split_k = 1
        if x.device.type == "cuda":
            sms = multi_processor_count(x.device)
            split_k = max(1, min(triton.cdiv(sms, tiles), K // block_k, 8))
    k_per_split = triton.cdiv(K // block_k, split_k) * block_k
    split_k = triton.cdiv(K, k_per_split)
    target = out if split_k == 1 else torch.empty(split_k, M, N, dtype=torch.float32, device=x.device)
    _awq_gemm_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n), split_k)](
        x, qweight, qzeros, scales, target,
        M, N, K, x.stride(0), N if split_k > 1 else out.stride(0), qweight.stride(0), qzeros.stride(0),
        scales.stride(0), group_size, k_per_split,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k,
        UPCAST=dot_upcast(_awq_gemm_kernel, x.dtype), FLOAT_ZERO=zero_terms is not None,
    )
    if split_k > 1:
        out.copy_(target.sum(dim=0))
    return out


# ---- torch reference: pack / unpack / dequantise / quantise / matmul ----

def awq_pack(values: torch.Tensor) -> torch.Tensor:
    """(R, C) ints in 0..15 -> (R, C / 8) int32 in AWQ's nibble order."""
    r, c = values.shape
    v = values.to(torch.int64).reshape(r, c // 8, 8)[:, :, AWQ_ORDER]
    packed = (v << (4 * torch.arange(8, device=values.device))).sum(-1)  # < 2^32, no overlap between nibbles
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """(R, C / 8) int32 -> (R, C) int32 values 0..15 (inverse of ``awq_pack``)."""
    shifts = 4 * torch.tensor(AWQ_REVERSE_ORDER, device=packed.device, dtype=torch.int32)
    return ((packed[:, :, None] >> shifts) & 0xF).reshape(packed.shape[0], -1)


def awq_dequantize(qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """The float32 (K, N) weight the packed tensors stand for."""
    q = awq_unpack(qweight).float()
    z = awq_unpack(qzeros).float().repeat_interleave(group_size, dim=0)
    return (q - z) * scales.float().repeat_interleave(group_size, dim=0)


def awq_quantize(w: torch.Tensor, group_size: int):
    """Asymmetric min/max 4-bit quantisation of a (K, N) weight -> (qweight, qzeros, scales fp16)."""
    k, n = w.shape
    g = w.float().reshape(k // group_size, group_size, n)
    lo, hi = g.amin(1), g.amax(1)
    scales = ((hi - lo).clamp(min=1e-5) / 15).half()
    zeros = (-lo / scales.float()).round().clamp(0, 15)
    q = (g / scales.float()[:, None] + zeros[:, None]).round().clamp(0, 15).reshape(k, n)
    return awq_pack(q.int()), awq_pack(zeros.int()), scales


def awq_gemm_ref(x, qweight, qzeros, scales, group_size: int) -> torch.Tensor:
    """Torch reference: dequantise to float32 and matmul; result in x's dtype."""
    return (x.float() @ awq_dequantize(qweight, qzeros, scales, group_size)).to(x.dtype)
