"""KV store: write the new tokens' keys and values into their slots of the paged KV cache.

Algorithm
    One program per new token t. ``slot = slot_mapping[t]``; slot -1 means "padding, write nothing".
    Otherwise the token's (num_kv_heads, head_dim) key and value rows are copied to
    ``k_cache[slot // block_size, slot % block_size]`` and ``v_cache[...]`` (one masked vector load/store of
    num_kv_heads * head_dim elements each).

Layout (the engine's, per layer)
    key, value:          (num_tokens, num_kv_heads, head_dim); the last dim must be contiguous, token and head
                         strides are free (so views into a fused qkv projection work).
    k_cache, v_cache:    (num_blocks, block_size, num_kv_heads, head_dim), contiguous, dtype of key/value.
    slot_mapping:        (num_tokens,) int32 or int64; -1 = skip.

Limits
    No dtype conversion (no fp8 cache); slots must be < num_blocks * block_size (not checked on the device).
    Pure bandwidth: 2 * 2 * num_tokens * num_kv_heads * head_dim * itemsize bytes moved.
"""

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device


@triton.jit
def _kv_store_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    block_size,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        # 1. Element e of the token's (num_kv_heads, head_dim) row: head e // HEAD_DIM, dim e % HEAD_DIM.
        offs = tl.arange(0, BLOCK)
        mask = offs < NUM_KV_HEADS * HEAD_DIM
        h = offs // HEAD_DIM
        d = offs % HEAD_DIM
        # 2. Gather from the (possibly strided) source rows.
        k = tl.load(key_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
        v = tl.load(value_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
        # 3. Scatter to the slot: cache rows are contiguous, so slot * (heads * dim) is the row start
        #    (block * block_size + offset == slot).
        dst = slot * (NUM_KV_HEADS * HEAD_DIM) + offs
        tl.store(k_cache_ptr + dst, k, mask=mask)
        tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write key/value rows into the paged caches in place (slot -1 = skip)."""
    assert key.dim() == 3 and value.shape == key.shape, (key.shape, value.shape)
    num_tokens, num_kv_heads, head_dim = key.shape
    assert k_cache.dim() == 4 and v_cache.shape == k_cache.shape, (k_cache.shape, v_cache.shape)
    assert k_cache.shape[2:] == (num_kv_heads, head_dim), (k_cache.shape, key.shape)
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert key.stride(2) == 1 and value.stride(2) == 1, "key/value last dim must be contiguous"
    assert key.dtype == value.dtype == k_cache.dtype == v_cache.dtype, (key.dtype, k_cache.dtype)
    assert slot_mapping.shape == (num_tokens,), (slot_mapping.shape, num_tokens)
    assert slot_mapping.dtype in (torch.int32, torch.int64), slot_mapping.dtype
    check_device(_kv_store_kernel, key, value, k_cache, v_cache, slot_mapping)
    if num_tokens == 0:
        return
    _kv_store_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.shape[1],
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK=triton.next_power_of_2(num_kv_heads * head_dim),
    )


def store_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Torch reference of ``store_kv`` (in place)."""
    block_size = k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_cache[blocks, offsets] = key[keep]
    v_cache[blocks, offsets] = value[keep]
