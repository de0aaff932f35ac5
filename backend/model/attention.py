"""Attention over the paged KV cache in plain torch (the CPU path).

The cache of one layer is (2, num_slots, num_kv_heads, head_dim): slot = block * block_size
+ offset. New K/V are written at their slots first, then each group reads its full context
back through the gathered slots, so prefix-cache hits and chunked prefill need no special case.
GQA is done by grouping query heads per KV head, so K/V are never repeated in memory. The cache may hold
a narrower dtype than the model computes in (`kv_cache_dtype`): K/V are rounded as they are stored, the
queries meet them in the cache's dtype, and the output goes back to the model's.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from backend.model.forward_batch import DecodeMetadata, ForwardBatch, PrefillMetadata
from backend.quant.cpu_gemm import dense_dtype
from kernels.cpu.paged_decode import paged_decode_cpu, paged_prefill_cpu, store_kv_cpu, supports, supports_store


def store_kv(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache: (2, num_slots, kv_heads, head_dim); k, v: (num_tokens, kv_heads, head_dim)."""
    cache[0].index_copy_(0, slot_mapping, k.to(cache.dtype))
    cache[1].index_copy_(0, slot_mapping, v.to(cache.dtype))


def gather_context(cache_half: torch.Tensor, blocks: torch.Tensor, block_size: int) -> torch.Tensor:
    """K or V of every context token: cache_half (num_slots, kv_heads, head_dim), blocks (n, ctx_blocks)
    -> (n, kv_heads, ctx_blocks * block_size, head_dim), a transposed view. Whole blocks are copied (one
    index_select of block_size-token rows): ~2x faster than gathering token slots (bench/README: engine
    profile); the tokens past each context's end come along and are masked."""
    n, ctx_blocks = blocks.shape
    paged = cache_half.view(-1, block_size, *cache_half.shape[1:])  # (num_blocks, block_size, kv_heads, head_dim)
    rows = paged.index_select(0, blocks.view(-1))  # (n * ctx_blocks, block_size, kv_heads, head_dim)
    return rows.view(n, ctx_blocks * block_size, *cache_half.shape[1:]).transpose(1, 2)


def compute_dtype(cache_dtype: torch.dtype, q_dtype: torch.dtype) -> torch.dtype:
    """What prefill attention multiplies in: the cache's dtype, unless it is bf16 on a CPU without native bf16
    (emulated there, several times slower than fp32: then the gathered K/V are widened to the queries' dtype)."""
    if cache_dtype == torch.bfloat16 and q_dtype == torch.float32 and dense_dtype("cpu") == torch.float32:
        return q_dtype
    return cache_dtype


def decode_attention(
    q: torch.Tensor, cache: torch.Tensor, meta: DecodeMetadata, scale: float, *, block_size: int
) -> torch.Tensor:
    """q: (num_decodes, num_heads, head_dim) -> (num_decodes, num_heads, head_dim).

    The query heads sharing a KV head are laid out as that head's queries (GQA without repeating K/V):
    one SDPA call over (n, kv_heads, group, head_dim) queries against (n, kv_heads, ctx, head_dim) keys."""
    n, num_heads, head_dim = q.shape
    kv_heads = cache.shape[2]
    k = gather_context(cache[0], meta.context_blocks, block_size)  # (n, kv_heads, ctx, head_dim)
    v = gather_context(cache[1], meta.context_blocks, block_size)
    grouped = q.view(n, kv_heads, num_heads // kv_heads, head_dim).to(cache.dtype)
    out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=meta.mask, scale=scale)  # (n, kv_heads, group, d)
    return out.reshape(n, num_heads, head_dim).to(q.dtype)


def prefill_attention(
    q: torch.Tensor, cache: torch.Tensor, meta: PrefillMetadata, scale: float, *, block_size: int
) -> torch.Tensor:
    """q: (num_prefill_tokens, num_heads, head_dim), packed -> same shape."""
    num_heads, head_dim = q.shape[1:]
    dtype = compute_dtype(cache.dtype, q.dtype)
    padded_q = q.new_zeros(*meta.query_index.shape, num_heads, head_dim, dtype=dtype)
    padded_q[meta.query_valid] = q.to(dtype)
    k = gather_context(cache[0], meta.context_blocks, block_size).to(dtype)  # (p, kv_heads, ctx, head_dim)
    v = gather_context(cache[1], meta.context_blocks, block_size).to(dtype)
    out = F.scaled_dot_product_attention(
        padded_q.transpose(1, 2), k, v, attn_mask=meta.mask, scale=scale, enable_gqa=True
    )  # (p, num_heads, max_query, head_dim)
    return out.transpose(1, 2)[meta.query_valid].to(q.dtype)


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, *, batch: ForwardBatch, scale: float,
    decode_kernel: ctypes.CDLL | None = None,
) -> torch.Tensor:
    """Store this step's K/V, then attend. q: (num_tokens, num_heads, head_dim). `decode_kernel`: the C paged
    decode kernel (kernels/cpu/paged_decode.h), used for the decode tokens (and its companion for storing K/V)
    where it takes their dtype, and for prefill chunks attended per token: its tiled prefill entry (the same
    arithmetic per token as a decode step, each key and value read once for 16 tokens, sliding windows included)."""
    if decode_kernel is not None and supports_store(k, v, cache):
        store_kv_cpu(decode_kernel, k, v, cache, slot_mapping=batch.slot_mapping)
    else:
        store_kv(cache, k, v, batch.slot_mapping)
    d = batch.num_decode_tokens
    parts = []
    if batch.decode is not None and decode_kernel is not None and supports(q, cache):
        m = batch.decode
        out = paged_decode_cpu(
            decode_kernel, q[:d], cache, m.block_tables, context_lens=m.context_lens, block_size=batch.block_size, scale=scale,
                window=batch.window,
            max_len=m.max_context_len,
        )
        parts.append(out)
    elif batch.decode is not None:
        parts.append(decode_attention(q[:d], cache, batch.decode, scale, block_size=batch.block_size))
    p = batch.prefill
    if p is not None and p.per_token and decode_kernel is not None and supports(q, cache):
        # every token as a decode query over its prefix (or window), tiles of tokens sharing K/V reads
        parts.append(paged_prefill_cpu(
            decode_kernel, q[d:], cache, p.block_tables, cu_seqlens_q=p.cu_seqlens_q, context_lens=p.context_lens,
                block_size=batch.block_size, scale=scale,
            window=batch.window, max_len=p.max_context_len,
        ))
    elif p is not None:
        parts.append(prefill_attention(q[d:], cache, p, scale, block_size=batch.block_size))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
