"""Rotary position embedding (neox / Llama "rotate_half" style) for q and k, in place or out of place.

Algorithm (one program per token; all its q heads and k heads in two [heads, head_dim/2] tiles)
    With x1 = x[..., :d/2], x2 = x[..., d/2:] and (cos, sin) = cos_sin_cache[position]:
        out1 = x1 * cos - x2 * sin
        out2 = x2 * cos + x1 * sin
    computed in float32 and rounded once to the activation dtype.

Layout
    positions:      (num_tokens,) int32/int64, each < max_position.
    q:              (num_tokens, num_heads, head_dim); k: (num_tokens, num_kv_heads, head_dim). The last dim
                    must be contiguous; token/head strides are free (views into a fused qkv output work).
    cos_sin_cache:  (max_position, head_dim) float32, [cos(pos * inv_freq) | sin(pos * inv_freq)] along the
                    last dim, as vLLM stores it; ``rope_cache`` builds it.
    inplace=True rotates q and k in place and returns them; otherwise returns new contiguous tensors.

Limits
    No GPT-J interleaved style, no rope scaling variants (build a scaled cache yourself: the kernel only reads
    it). head_dim must be even; it need not be a power of two: a partial rotary (Phi-4-mini: 96 of 128 dims)
    passes the dims that turn, and the half-width tile is masked up to the next power of two.
"""

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device


@triton.jit
def _rotate_tile(src_ptr, dst_ptr, t, stride_st, stride_sh, stride_dt, stride_dh, n_heads, cos, sin,
                 HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < n_heads) & (d < HALF)
    src = src_ptr + t * stride_st + h * stride_sh + d
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + t * stride_dt + h * stride_dh + d
    ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh, stride_kot, stride_koh, stride_c,
    num_heads, num_kv_heads,
    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    # 1. This token's cos/sin row (shared by every head of q and k).
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)[None, :]
    cos = tl.load(cache_ptr + pos * stride_c + d, mask=d < HALF, other=0.0)
    sin = tl.load(cache_ptr + pos * stride_c + HALF + d, mask=d < HALF, other=0.0)
    # 2. Rotate all query heads, then all key heads (a load of both halves, then a store of both halves,
    #    so in-place is safe).
    _rotate_tile(q_ptr, q_out_ptr, t, stride_qt, stride_qh, stride_qot, stride_qoh, num_heads, cos, sin,
                 HALF, BLOCK_D, BLOCK_HQ)
    _rotate_tile(k_ptr, k_out_ptr, t, stride_kt, stride_kh, stride_kot, stride_koh, num_kv_heads, cos, sin,
                 HALF, BLOCK_D, BLOCK_HK)


def rope_cache(head_dim: int, max_position: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """The (max_position, head_dim) float32 [cos | sin] cache (SmolLM2: base = rope_theta = 100000)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
    freqs = torch.arange(max_position, dtype=torch.float64, device=device)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                     inplace: bool = False):
    """Apply rotary embedding to q and k; returns ``(q_rot, k_rot)`` (q and k themselves when in place)."""
    assert q.dim() == 3 and k.dim() == 3 and q.shape[0] == k.shape[0] and q.shape[2] == k.shape[2]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    assert head_dim % 2 == 0, head_dim  # any even width: Phi-4-mini turns 96 of its 128 dims
    assert q.stride(2) == 1 and k.stride(2) == 1, "q/k last dim must be contiguous"
    assert q.dtype == k.dtype and q.dtype in (torch.float32, torch.float16, torch.bfloat16), q.dtype
    assert positions.shape == (num_tokens,) and positions.dtype in (torch.int32, torch.int64)
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == head_dim, cos_sin_cache.shape
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1
    check_device(_rotary_kernel, positions, q, k, cos_sin_cache)
    q_out = q if inplace else torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = k if inplace else torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            positions, q, k, q_out, k_out, cos_sin_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1), cos_sin_cache.stride(0),
            num_heads, num_kv_heads,
            HALF=head_dim // 2, BLOCK_D=triton.next_power_of_2(head_dim // 2),
            BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        )
    return q_out, k_out


def rotary_embedding_ref(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                         cos_sin_cache: torch.Tensor):
    """Torch reference (out of place), the HF ``apply_rotary_pos_emb`` formula in float32."""
    half = q.shape[-1] // 2
    cos, sin = cos_sin_cache[positions.long()].split(half, dim=-1)
    cos = torch.cat([cos, cos], dim=-1)[:, None, :]
    sin = torch.cat([sin, sin], dim=-1)[:, None, :]

    def rotate_half(x):
        return torch.cat([-x[..., half:], x[..., :half]], dim=-1)

    return tuple((x.float() * cos + rotate_half(x.float()) * sin).to(x.dtype) for x in (q, k))
