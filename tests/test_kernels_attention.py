"""kernels/triton/paged_decode.py and kernels/triton/flash_prefill.py against their torch references (Triton interpreter),
and the references against SDPA on contiguous K/V placed into pages independently."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by @triton.jit when the kernel module is imported

import pytest
import torch
import torch.nn.functional as F

from kernels.triton import flash_prefill as fp
from kernels.triton import paged_decode as pd
from kernels.triton.testing import assert_close, device_for, generator, poison, ready

ready(pd)
ready(fp)
DEV = device_for(pd)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def make_paged(g, lengths, num_kv_heads, head_dim, block_size, dtype, spare_blocks=3):
    """Contiguous per-sequence K/V, scattered into shuffled pages by a plain per-slot loop.

    Returns (k_cache, v_cache, block_tables, ks, vs); unused cache rows hold large garbage, so a kernel that
    reads past a sequence's length or through a wrong block shows up as a wrong result.
    """
    need = [-(-n // block_size) for n in lengths]
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=g).tolist()
    width = max(max(need), 1) + 1  # one extra padded column
    block_tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = (torch.randn(shape, generator=g) * 100).to(dtype)
    v_cache = (torch.randn(shape, generator=g) * 100).to(dtype)
    ks, vs = [], []
    for i, n in enumerate(lengths):
        blocks = [perm.pop() for _ in range(need[i])]
        block_tables[i, : need[i]] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        v = torch.randn(n, num_kv_heads, head_dim, generator=g).to(dtype)
        for pos in range(n):
            k_cache[blocks[pos // block_size], pos % block_size] = k[pos]
            v_cache[blocks[pos // block_size], pos % block_size] = v[pos]
        ks.append(k)
        vs.append(v)
    return k_cache, v_cache, block_tables, ks, vs


def sdpa(q, k, v, causal_offset=None):
    """q (m, H, D), k/v (n, Hkv, D) -> (m, H, D) with torch's SDPA (GQA by enable_gqa), float64."""
    q, k, v = (x.double().transpose(0, 1) for x in (q, k, v))
    mask = None
    if causal_offset is not None:  # query i sits at position causal_offset + i
        qpos = causal_offset + torch.arange(q.shape[1])
        mask = torch.arange(k.shape[1])[None, :] <= qpos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(0, 1)


# (num_heads, num_kv_heads, head_dim, block_size, seq_lens, num_splits, block_n): GQA 1/3/8, head_dim 64/128,
# a single-token context, partially filled last blocks, contexts over many blocks, split-K with empty splits
DECODE_CASES = [
    (9, 3, 64, 16, [1, 37, 130], 1, 32),
    (9, 3, 64, 16, [1, 37, 130], 3, 16),
    (8, 1, 64, 8, [70, 5], 4, 16),
    (2, 2, 128, 32, [33, 64, 1], 2, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}sp{c[5]}")
def test_paged_decode(dtype, case):
    num_heads, num_kv_heads, head_dim, block_size, lengths, num_splits, block_n = case
    g = generator("decode", dtype, case)
    k_cache, v_cache, bt, _, _ = make_paged(g, lengths, num_kv_heads, head_dim, block_size, dtype)
    q = torch.randn(len(lengths), num_heads, head_dim, generator=g).to(dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    ref = pd.paged_decode_ref(q.float(), k_cache.float(), v_cache.float(), bt, seq_lens=seq_lens)
    out = poison(*q.shape, dtype=dtype, device=DEV)
    args = [t.to(DEV) for t in (q, k_cache, v_cache, bt, seq_lens)]
    res = pd.paged_decode(*args, out=out, num_splits=num_splits, block_n=block_n)
    assert res is out
    assert_close(out, ref, dtype)


def test_paged_decode_empty_sequence_gives_zeros():
    g = generator("decode-empty")
    k_cache, v_cache, bt, _, _ = make_paged(g, [20, 0], 3, 64, 16, torch.float16)
    q = torch.randn(2, 9, 64, generator=g).half()
    seq_lens = torch.tensor([20, 0], dtype=torch.int32)
    ref = pd.paged_decode_ref(q.float(), k_cache.float(), v_cache.float(), bt, seq_lens=seq_lens)
    for splits in (1, 2):
        out = poison(2, 9, 64, dtype=torch.float16, device=DEV)
        pd.paged_decode(*(t.to(DEV) for t in (q, k_cache, v_cache, bt, seq_lens)), out=out, num_splits=splits)
        assert_close(out, ref)
        assert (out[1] == 0).all()


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 1)])
def test_paged_decode_reference_against_sdpa(num_heads, num_kv_heads):
    g = generator("decode-ref", num_heads, num_kv_heads)
    lengths = [1, 23, 50]
    k_cache, v_cache, bt, ks, vs = make_paged(g, lengths, num_kv_heads, 32, 8, torch.float32)
    q = torch.randn(3, num_heads, 32, generator=g)
    ref = pd.paged_decode_ref(q, k_cache, v_cache, bt, seq_lens=torch.tensor(lengths, dtype=torch.int32))
    for i in range(3):
        torch.testing.assert_close(ref[i].double(), sdpa(q[i : i + 1], ks[i], vs[i])[0], atol=1e-5, rtol=1e-5)


# (num_heads, num_kv_heads, head_dim, block_size, [(q_len, ctx_len)...], block_m, block_n):
# a whole prompt of odd length, a single token, a chunk after a prefix spanning several blocks (chunked
# prefill), a prefix-cache hit ending mid-block, a 1-token "decode" row mixed in; GQA 1/3/8; head_dim 64/128
PREFILL_CASES = [
    (9, 3, 64, 16, [(37, 37), (1, 1), (5, 70), (20, 27)], 16, 16),
    (9, 3, 64, 16, [(37, 37), (1, 50), (18, 83)], 32, 16),
    (8, 1, 64, 8, [(19, 19), (6, 30)], 16, 32),
    (2, 2, 128, 32, [(40, 40), (3, 35)], 16, 16),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"h{c[0]}kv{c[1]}d{c[2]}bs{c[3]}m{c[5]}n{c[6]}")
def test_flash_prefill(dtype, case):
    num_heads, num_kv_heads, head_dim, block_size, seqs, block_m, block_n = case
    g = generator("prefill", dtype, case)
    q_lens = [a for a, _ in seqs]
    lengths = [n for _, n in seqs]
    k_cache, v_cache, bt, _, _ = make_paged(g, lengths, num_kv_heads, head_dim, block_size, dtype)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    q = torch.randn(sum(q_lens), num_heads, head_dim, generator=g).to(dtype)
    ref = fp.flash_prefill_ref(q.float(), k_cache.float(), v_cache.float(), bt, cu_seqlens_q=cu, seq_lens=seq_lens)
    out = poison(*q.shape, dtype=dtype, device=DEV)
    args = [t.to(DEV) for t in (q, k_cache, v_cache, bt, cu, seq_lens)]
    res = fp.flash_prefill(*args, max_query_len=max(q_lens), out=out, block_m=block_m, block_n=block_n)
    assert res is out
    assert_close(out, ref, dtype)


def test_flash_prefill_without_max_query_len_and_strided_q():
    """max_query_len computed from cu_seqlens; q a view into a fused qkv buffer; padding rows untouched."""
    g = generator("prefill-strided")
    k_cache, v_cache, bt, _, _ = make_paged(g, [21, 9], 3, 64, 16, torch.float16)
    qkv = torch.randn(32, 15, 64, generator=g).half()
    q = qkv[:, :9]
    cu = torch.tensor([0, 21, 30], dtype=torch.int32)  # rows 30, 31: padding
    seq_lens = torch.tensor([21, 9], dtype=torch.int32)
    out = poison(32, 9, 64, dtype=torch.float16, device=DEV)
    fp.flash_prefill(*(t.to(DEV) for t in (q, k_cache, v_cache, bt, cu, seq_lens)), out=out, block_m=16)
    ref = fp.flash_prefill_ref(q.float(), k_cache.float(), v_cache.float(), bt, cu_seqlens_q=cu, seq_lens=seq_lens)
    assert_close(out[:30], ref[:30], torch.float16)
    assert out[30:].isnan().all()


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 1)])
def test_flash_prefill_reference_against_sdpa(num_heads, num_kv_heads):
    g = generator("prefill-ref", num_heads, num_kv_heads)
    seqs = [(1, 1), (12, 12), (7, 40)]
    k_cache, v_cache, bt, ks, vs = make_paged(g, [n for _, n in seqs], num_kv_heads, 32, 8, torch.float32)
    cu = torch.tensor([0, 1, 13, 20], dtype=torch.int32)
    q = torch.randn(20, num_heads, 32, generator=g)
    seq_lens = torch.tensor([n for _, n in seqs], dtype=torch.int32)
    ref = fp.flash_prefill_ref(q, k_cache, v_cache, bt, cu_seqlens_q=cu, seq_lens=seq_lens)
    for i, (m, n) in enumerate(seqs):
        a, b = int(cu[i]), int(cu[i + 1])
        expected = sdpa(q[a:b], ks[i], vs[i], causal_offset=n - m)
        torch.testing.assert_close(ref[a:b].double(), expected, atol=1e-5, rtol=1e-5)
