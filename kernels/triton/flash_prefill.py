"""Flash-attention prefill over the paged KV cache: causal, variable-length packed sequences, GQA.

Algorithm (FlashAttention-2 forward, online softmax in tiles)
    Grid (cdiv(max_query_len, BLOCK_M), num_heads, num_seqs). Sequence i contributes q_len_i new tokens,
    packed at rows [cu_seqlens_q[i], cu_seqlens_q[i+1]) of q; it has ctx_len_i = seq_lens[i] tokens in total,
    so its queries sit at positions [ctx_len_i - q_len_i, ctx_len_i) (a prefix-cache hit or an earlier chunk
    of a chunked prefill is the first part, already in pages). Query at position p attends to keys at
    positions 0..p. *All* keys, the new ones included, are read from the paged cache through the block table,
    so ``kv_store`` must have written the new tokens' K/V first.
    A program takes BLOCK_M queries of one head and walks key tiles of BLOCK_N positions:
        stage 1: keys [0, first_query_pos + 1) rounded down to BLOCK_N: visible to every row, no mask;
        stage 2: the remaining keys up to the last query's position, with the causal mask;
        per tile: s = q @ k^T * scale * log2(e); m_new = max(m, rowmax s); p = 2^(s - m_new);
                  l = l * 2^(m - m_new) + rowsum p; acc = acc * 2^(m - m_new) + p @ v.
    out = acc / l. Keys/values are gathered row by row: block_table[seq, pos // block_size], pos % block_size.
    GQA: head h reads KV head h // (num_heads / num_kv_heads); the group's programs re-read the same K/V tiles
    (hits in L2 on a GPU) rather than packing heads into one tile.

Layout (the engine's)
    q, out:            (num_tokens, num_heads, head_dim) packed, last dim contiguous.
    k_cache, v_cache:  (num_blocks, block_size, num_kv_heads, head_dim), contiguous.
    block_tables:      (num_seqs, max_blocks_per_seq) int32, padded with 0.
    cu_seqlens_q:      (num_seqs + 1,) int32, cumulative new-token counts, cu_seqlens_q[0] == 0.
    seq_lens:          (num_seqs,) int32, total tokens per sequence including the new ones (>= q_len).

Limits
    head_dim a power of two >= 16 (64, 128); no ALiBi, soft-capping or fp8 cache; rows of q
    not covered by cu_seqlens_q are left untouched. ``max_query_len`` sizes the grid; pass it from the host
    (the scheduler knows it) to avoid a device-to-host sync.

Sliding window
    ``window`` > 0: the query at position p sees keys p - window < k <= p (HF's rule). Stage 1 is then empty
    and stage 2 starts at the tile holding the first query's first visible key, masking both edges; a row
    whose keys in a tile are all masked keeps m = -inf without producing NaNs.
"""

import math

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device, dot_upcast, mma


@triton.jit
def _attend(acc, m_i, l_i, q, qpos, k_cache_ptr, v_cache_ptr, bt_row_ptr, kv_off, stride_cb, stride_cs,
            block_size, ctx_len, lo, hi, qk_scale, window,
            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
            UPCAST: tl.constexpr):
    d = tl.arange(0, HEAD_DIM)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < ctx_len
        block = tl.load(bt_row_ptr + n // block_size, mask=n_ok, other=0).to(tl.int64)
        row = block * stride_cb + (n % block_size) * stride_cs + kv_off
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=n_ok[:, None], other=0.0)
        s = mma(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST) * qk_scale
        if CAUSAL:
            visible = (n[None, :] <= qpos[:, None]) & n_ok[None, :]
            if window > 0:
                visible = visible & (n[None, :] > qpos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if CAUSAL:  # a row with nothing visible yet (sliding window) keeps m = -inf: shift by 0, not by -inf
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=n_ok[:, None], other=0.0)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _flash_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, cu_q_ptr, seq_lens_ptr, out_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    qk_scale, block_size, window,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    tile = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    if tile * BLOCK_M < q_len:
        # 1. This tile's queries: rows q_start + i, positions prefix + i.
        ctx_len = tl.load(seq_lens_ptr + seq)
        prefix = ctx_len - q_len
        i = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        i_ok = i < q_len
        qpos = prefix + i
        d = tl.arange(0, HEAD_DIM)
        tok = (q_start + i).to(tl.int64)
        q = tl.load(q_ptr + tok[:, None] * stride_qt + head * stride_qh + d[None, :], mask=i_ok[:, None],
                    other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        bt_row = bt_ptr + seq * stride_bt
        kv_off = (head // GROUP) * stride_ch
        first = prefix + tile * BLOCK_M
        last = tl.minimum(first + BLOCK_M, ctx_len) - 1
        full_end = (first + 1) // BLOCK_N * BLOCK_N
        lo = full_end - full_end  # 0, as a tensor like the value the window branch assigns
        if window > 0:  # no key is visible to every row; start at the first query's first visible key
            lo = tl.maximum(first - window + 1, 0) // BLOCK_N * BLOCK_N
            full_end = lo
        # 2. Keys every row of the tile sees (positions <= first): no mask.
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, qpos, k_cache_ptr, v_cache_ptr, bt_row, kv_off, stride_cb,
                                stride_cs, block_size, ctx_len, lo, full_end, qk_scale, window,
                                HEAD_DIM, BLOCK_M, BLOCK_N, False, UPCAST)
        # 3. The diagonal band up to the last query's position, causally masked.
        acc, m_i, l_i = _attend(acc, m_i, l_i, q, qpos, k_cache_ptr, v_cache_ptr, bt_row, kv_off, stride_cb,
                                stride_cs, block_size, ctx_len, full_end, last + 1, qk_scale, window,
                                HEAD_DIM, BLOCK_M, BLOCK_N, True, UPCAST)
        # 4. Normalise and store the valid rows.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # l == 0 only on padding rows past a sliding window
        tl.store(out_ptr + tok[:, None] * stride_ot + head * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=i_ok[:, None])


def flash_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, max_query_len: int | None = None,
                  scale: float | None = None, out=None, block_m: int = 64, block_n: int = 64, window: int = 0):
    """Causal prefill attention of packed new tokens over the paged cache; returns ``out`` shaped like q."""
    assert q.dim() == 3 and q.stride(2) == 1, (q.shape, q.stride())
    _, num_heads, head_dim = q.shape
    assert k_cache.dim() == 4 and v_cache.shape == k_cache.shape, (k_cache.shape, v_cache.shape)
    num_kv_heads = k_cache.shape[2]
    assert k_cache.shape[3] == head_dim and num_heads % num_kv_heads == 0, (q.shape, k_cache.shape)
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert head_dim >= 16 and triton.next_power_of_2(head_dim) == head_dim, head_dim
    assert q.dtype == k_cache.dtype == v_cache.dtype, (q.dtype, k_cache.dtype)
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16), q.dtype
    num_seqs = seq_lens.shape[0]
    assert seq_lens.shape == (num_seqs,) and seq_lens.dtype == torch.int32 and seq_lens.is_contiguous()
    assert cu_seqlens_q.shape == (num_seqs + 1,) and cu_seqlens_q.dtype == torch.int32
    assert cu_seqlens_q.is_contiguous()
    assert block_tables.dim() == 2 and block_tables.shape[0] == num_seqs and block_tables.dtype == torch.int32
    assert block_tables.stride(1) == 1, block_tables.stride()
    for b in (block_m, block_n):
        assert b >= 16 and triton.next_power_of_2(b) == b, (block_m, block_n)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(2) == 1, (out.shape, out.dtype)
    check_device(_flash_prefill_kernel, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out)
    if max_query_len is None:  # device -> host sync; pass it in on the hot path
        max_query_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if num_seqs else 0
    if num_seqs == 0 or max_query_len == 0:
        return out
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    _flash_prefill_kernel[(triton.cdiv(max_query_len, block_m), num_heads, num_seqs)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale * 1.4426950408889634, k_cache.shape[1], window,
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        UPCAST=dot_upcast(_flash_prefill_kernel, q.dtype),
    )
    return out


def flash_prefill_ref(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale: float | None = None,
                      window: int = 0):
    """Torch reference: per sequence, gather K/V through the block table, causal softmax attention in fp32
    (keys within ``window`` positions when window > 0)."""
    num_heads, head_dim = q.shape[1:]
    group = num_heads // k_cache.shape[2]
    block_size = k_cache.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros_like(q)
    for i in range(seq_lens.shape[0]):
        a, b, n = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(seq_lens[i])
        blocks = block_tables[i, : triton.cdiv(n, block_size)].long()
        k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:n].float().repeat_interleave(group, dim=1)
        v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:n].float().repeat_interleave(group, dim=1)
        qpos = torch.arange(n - (b - a), n, device=q.device)
        s = torch.einsum("thd,nhd->htn", q[a:b].float(), k) * scale
        future = torch.arange(n, device=q.device)[None, None, :] > qpos[None, :, None]
        if window > 0:
            future |= torch.arange(n, device=q.device)[None, None, :] <= qpos[None, :, None] - window
        s = s.masked_fill(future, float("-inf"))
        out[a:b] = torch.einsum("htn,nhd->thd", s.softmax(dim=-1), v).to(q.dtype)
    return out
