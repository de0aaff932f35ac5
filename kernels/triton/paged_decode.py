"""Paged decode attention (flash-decoding): one new query token per sequence against its paged KV cache.

Algorithm
    Grid (num_seqs, num_kv_heads, num_splits). A program owns one sequence, one KV head and one split, a
    contiguous range of ``partition_size`` key positions (split-K over long contexts, so short batches still
    fill the GPU). GQA: the program loads the whole query group of that KV head (``group = num_heads /
    num_kv_heads`` query heads) as one [BLOCK_G, head_dim] tile, so each K/V tile is read once per group.
    For each tile of BLOCK_N key positions:
        block = block_table[seq, pos // block_size];  row = block, pos % block_size   (gather through pages)
        s = q @ k^T * scale * log2(e)                  (tl.dot, fp32 accumulation; masked past seq_len)
        online softmax: m_new = max(m, rowmax(s)); p = 2^(s - m_new); l = l * 2^(m - m_new) + rowsum(p)
        acc = acc * 2^(m - m_new) + p @ v
    One split: out = acc / l. Several: each split writes (acc, m, l) in float32 and a second kernel
    (grid (num_seqs, num_heads)) rescales by 2^(m_i - max m) and sums: out = sum(w_i acc_i) / sum(w_i l_i).

Layout (the engine's)
    q, out:            (num_seqs, num_heads, head_dim), last dim contiguous.
    k_cache, v_cache:  (num_blocks, block_size, num_kv_heads, head_dim), contiguous.
    block_tables:      (num_seqs, max_blocks_per_seq) int32, padded with 0.
    seq_lens:          (num_seqs,) int32, context length including the new token (already stored by
                       kv_store). A sequence with seq_len 0 (batch padding) gets an all-zero output.

Limits
    head_dim a power of two >= 16 (64, 128); num_heads a multiple of num_kv_heads; no ALiBi,
    logit soft-capping or fp8 cache. Sliding window: ``window`` > 0 limits the query (position seq_len - 1)
    to keys at positions >= seq_len - window; tiles before the window are skipped.
    The number of splits is fixed on the host from the block table's width
    (no device-to-host sync, CUDA-graph friendly), so very wide tables launch programs that exit at once.
"""

import math

import torch
import triton
import triton.language as tl

from kernels.triton._utils import check_device, dot_upcast, mma, multi_processor_count


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, bt_ptr, seq_lens_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    stride_qs, stride_qh, stride_os, stride_oh, stride_cb, stride_cs, stride_ch, stride_bt,
    qk_scale, block_size, partition_size, num_splits, num_heads, window,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, UPCAST: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * partition_size
    end = tl.minimum(start + partition_size, seq_len)
    if window > 0:  # sliding window: keys before seq_len - window are invisible
        start = tl.maximum(start, seq_len - window)

    # 1. The query group of this KV head: rows g < GROUP are heads kvh * GROUP + g.
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + g
    g_mask = g < GROUP
    q = tl.load(q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :], mask=g_mask[:, None],
                other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], dtype=tl.float32)
    # 2. Walk this split's key positions tile by tile, gathering rows through the block table.
    for n0 in range(start, end, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_mask = n < end
        block = tl.load(bt_ptr + seq * stride_bt + n // block_size, mask=n_mask, other=0).to(tl.int64)
        row = block * stride_cb + (n % block_size) * stride_cs + kvh * stride_ch
        k = tl.load(k_cache_ptr + row[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
        s = mma(q, tl.trans(k), tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32), UPCAST) * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        # 3. Online softmax in base 2 (qk_scale already holds log2(e)).
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + row[:, None] + d[None, :], mask=n_mask[:, None], other=0.0)
        acc = mma(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new

    if SPLIT:
        # 4a. Partial results for the reduction kernel: acc unnormalised, m and l per head.
        base = (seq * num_heads + heads) * num_splits + split
        tl.store(part_acc_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_ml_ptr + 2 * base, m_i, mask=g_mask)
        tl.store(part_ml_ptr + 2 * base + 1, l_i, mask=g_mask)
    else:
        # 4b. Single split: normalise and store (l == 0 only for an empty sequence -> zeros).
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + seq * stride_os + heads[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=g_mask[:, None])


@triton.jit
def _paged_decode_reduce_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr, stride_os, stride_oh, num_splits, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_DIM)
    s_mask = sp < num_splits
    base = (seq * num_heads + head) * num_splits + sp
    # 1. Global max over the splits' maxima (empty splits hold m = -inf, l = 0).
    m = tl.load(part_ml_ptr + 2 * base, mask=s_mask, other=float("-inf"))
    l_s = tl.load(part_ml_ptr + 2 * base + 1, mask=s_mask, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    # 2. Rescale each split to the global max and combine.
    w = tl.exp2(m - m_max)
    acc = tl.load(part_acc_ptr + base[:, None] * HEAD_DIM + d[None, :], mask=s_mask[:, None], other=0.0)
    num = tl.sum(acc * w[:, None], axis=0)
    den = tl.sum(l_s * w, axis=0)
    out = num / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d, out.to(out_ptr.dtype.element_ty))


def _default_num_splits(device: torch.device, programs: int, max_context: int, block_n: int) -> int:
    if device.type != "cuda":
        return 1
    target = 2 * multi_processor_count(device)
    # at least 256 keys per split so the (acc, m, l) round trip stays small next to the K/V reads
    return max(1, min(triton.cdiv(target, programs), triton.cdiv(max_context, max(256, block_n))))


def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, scale: float | None = None, out=None,
                 num_splits: int | None = None, block_n: int = 64, window: int = 0):
    """Decode attention for one query token per sequence; returns ``out`` (num_seqs, num_heads, head_dim)."""
    assert q.dim() == 3 and q.stride(2) == 1, (q.shape, q.stride())
    num_seqs, num_heads, head_dim = q.shape
    assert k_cache.dim() == 4 and v_cache.shape == k_cache.shape, (k_cache.shape, v_cache.shape)
    _, block_size, num_kv_heads, _ = k_cache.shape
    assert k_cache.shape[3] == head_dim and num_heads % num_kv_heads == 0, (q.shape, k_cache.shape)
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), "caches must be contiguous"
    assert head_dim >= 16 and triton.next_power_of_2(head_dim) == head_dim, head_dim
    assert q.dtype == k_cache.dtype == v_cache.dtype, (q.dtype, k_cache.dtype)
    assert q.dtype in (torch.float32, torch.float16, torch.bfloat16), q.dtype
    assert block_tables.dim() == 2 and block_tables.shape[0] == num_seqs and block_tables.dtype == torch.int32
    assert block_tables.stride(1) == 1, block_tables.stride()
    assert seq_lens.shape == (num_seqs,) and seq_lens.dtype == torch.int32 and seq_lens.is_contiguous()
    assert block_n >= 16 and triton.next_power_of_2(block_n) == block_n, block_n
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride(2) == 1, (out.shape, out.dtype)
    check_device(_paged_decode_kernel, q, k_cache, v_cache, block_tables, seq_lens, out)
    if num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    max_context = max(1, block_tables.shape[1] * block_size)  # upper bound known on the host
    if num_splits is None:
        num_splits = _default_num_splits(q.device, num_seqs * num_kv_heads, max_context, block_n)
    partition_size = triton.cdiv(triton.cdiv(max_context, num_splits), block_n) * block_n
    num_splits = triton.cdiv(max_context, partition_size)
    split = num_splits > 1
    part_acc = part_ml = out  # dummies when unused
    if split:
        f32 = dict(dtype=torch.float32, device=q.device)
        part_acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, **f32)
        part_ml = torch.empty(num_seqs, num_heads, num_splits, 2, **f32)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_acc, part_ml,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        scale * 1.4426950408889634, block_size, partition_size, num_splits, num_heads, window,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, BLOCK_N=block_n,
        SPLIT=split, UPCAST=dot_upcast(_paged_decode_kernel, q.dtype),
    )
    if split:
        _paged_decode_reduce_kernel[(num_seqs, num_heads)](
            part_acc, part_ml, out, out.stride(0), out.stride(1), num_splits, num_heads,
            HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits),
        )
    return out


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` (num_kv_heads, head_dim) rows of one sequence's pages, contiguous."""
    block_size = cache.shape[1]
    blocks = block_table[: triton.cdiv(length, block_size)].long()
    return cache[blocks].reshape(-1, *cache.shape[2:])[:length]


def paged_decode_ref(q, k_cache, v_cache, block_tables, seq_lens, scale: float | None = None, window: int = 0):
    """Torch reference: per sequence, gather K/V through the block table and run softmax attention in fp32
    (over the last ``window`` keys when window > 0)."""
    num_seqs, num_heads, head_dim = q.shape
    group = num_heads // k_cache.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    out = torch.zeros_like(q)
    for i in range(num_seqs):
        n = int(seq_lens[i])
        if n == 0:
            continue
        k = gather_kv(k_cache, block_tables[i], n).float().repeat_interleave(group, dim=1)  # (n, H, D)
        v = gather_kv(v_cache, block_tables[i], n).float().repeat_interleave(group, dim=1)
        s = torch.einsum("hd,nhd->hn", q[i].float(), k) * scale
        if window > 0:
            s[:, : max(n - window, 0)] = float("-inf")
        out[i] = torch.einsum("hn,nhd->hd", s.softmax(dim=-1), v).to(q.dtype)
    return out
