"""The C paged decode attention kernel (kernels/cpu/paged_decode.h; its AVX2 and AVX-512 builds) against its torch
reference and the engine's torch decode path. Skipped, saying why, where the C kernels cannot be built (not x86 AVX2,
no C compiler)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from backend.model.attention import decode_attention
from backend.model.forward_batch import DecodeMetadata
from kernels.cpu.paged_decode import (
    load_paged_decode,
    paged_decode_cpu,
    paged_decode_cpu_ref,
    paged_prefill_cpu,
    store_kv_cpu,
    supports,
)
from tests.c_kernels import ISAS, build, requires_c_kernels

pytestmark = requires_c_kernels


@pytest.fixture(scope="module", params=ISAS)
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return build(partial(load_paged_decode, isa=request.param), tmp_path_factory, f"paged_decode-{request.param}")


def case(lens: list[int], heads: int, kv_heads: int, head_dim: int, block_size: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = 64
    cache = torch.randn(2, num_blocks * block_size, kv_heads, head_dim, generator=g)
    max_blocks = max(-(-n // block_size) for n in lens)
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:max_blocks] for _ in lens]).int()
    q = torch.randn(len(lens), heads, head_dim, generator=g)
    return q, cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (16, 1, 128), (8, 2, 8)])
@pytest.mark.parametrize("window", [0, 5, 24])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference(lib, heads: int, kv_heads: int, head_dim: int, window: int, dtype: torch.dtype) -> None:
    lens = [1, 7, 8, 9, 16, 17, 40, 100]  # under, at and over a block and the 8-key tile
    q, cache, tables, lens_t = case(lens, heads, kv_heads, head_dim)
    cache = cache.to(dtype)
    out = paged_decode_cpu(lib, q, cache, tables, context_lens=lens_t, block_size=16, scale=0.125, window=window)
    ref = paged_decode_cpu_ref(q, cache, tables, lens_t, block_size=16, scale=0.125, window=window)
    assert out.shape == q.shape
    assert (out - ref).abs().max().item() < 1e-5


def test_matches_the_torch_decode_path(lib) -> None:
    """Same inputs as the engine's block gather + masked SDPA (backend/attention.decode_attention)."""
    lens = [3, 30, 64, 65]
    q, cache, tables, lens_t = case(lens, 9, 3, 64, block_size=16, seed=1)
    k_pos = torch.arange(tables.shape[1] * 16)
    mask = torch.where(k_pos[None] < lens_t[:, None].long(), 0.0, float("-inf"))[:, None, None, :]
    torch_out = decode_attention(q, cache, DecodeMetadata(tables.long(), mask, tables, lens_t), 0.125, block_size=16)
    assert (paged_decode_cpu(lib, q, cache, tables, context_lens=lens_t, block_size=16,
        scale=0.125) - torch_out).abs().max().item() < 1e-5


def prefill_case(chunks: list[tuple[int, int]], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 num_blocks: int = 64):
    """Prefill chunks (tokens already in the cache, new tokens) packed as the model runner packs them, and the same
    queries as per-token decode queries over their causal prefixes (what the decode kernel is given for them)."""
    g = torch.Generator().manual_seed(2)
    bs = 16
    cache = torch.randn(2, num_blocks * bs, kv_heads, head_dim, generator=g).to(dtype)
    width = max(-(-(done + new) // bs) for done, new in chunks)
    order = torch.randperm(num_blocks, generator=g).int()
    tables, used = [], 0
    for done, new in chunks:  # each sequence its own scattered blocks
        n = -(-(done + new) // bs)
        tables.append(torch.cat([order[used : used + n], torch.zeros(width - n, dtype=torch.int32)]))
        used += n
    table = torch.stack(tables)
    cu = torch.tensor([0, *torch.tensor([new for _, new in chunks]).cumsum(0).tolist()], dtype=torch.int32)
    lens = torch.tensor([done + new for done, new in chunks], dtype=torch.int32)
    q = torch.randn(int(cu[-1]), heads, head_dim, generator=g)
    rows = torch.tensor([new for _, new in chunks])
    query_lens = torch.tensor([done + 1 + j for done, new in chunks for j in range(new)], dtype=torch.int32)
    return q, cache, table, cu, lens, table.repeat_interleave(rows, dim=0), query_lens


def assert_prefill_is_per_token_decode(lib, case: tuple[torch.Tensor, ...], window: int) -> None:
    """The tiled prefill entry over prefill_case's chunks equals the decode entry over their tokens, bit for bit, and
    the reference within fp32 rounding."""
    q, cache, table, cu, lens, query_tables, query_lens = case
    out = paged_prefill_cpu(lib, q, cache, table, cu_seqlens_q=cu, context_lens=lens, block_size=16, scale=0.125,
                            window=window)
    decoded = paged_decode_cpu(lib, q, cache, query_tables, context_lens=query_lens, block_size=16, scale=0.125,
                               window=window)
    assert torch.equal(out, decoded)
    ref = paged_decode_cpu_ref(q, cache, query_tables, query_lens, block_size=16, scale=0.125, window=window)
    assert (out - ref).abs().max().item() < 1e-5


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 40), (16, 1, 128), (8, 2, 8), (4, 1, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 5, 24, 61])
def test_prefill_equals_per_token_decode_to_the_bit(lib, heads: int, kv_heads: int, head_dim: int, dtype, window: int) -> None:
    """A chunk's tokens through the tiled prefill entry get the decode kernel's result bit for bit (batch invariance
    between prefill chunks and decode steps): chunks shorter and longer than a tile, after cached context, starting
    and ending on and off the 8-key groups; full attention and sliding windows shorter and longer than a tile, whose
    starts fall on and off the groups."""
    chunks = [(0, 37), (5, 1), (100, 200), (17, 9), (0, 8), (31, 33)]
    assert_prefill_is_per_token_decode(lib, prefill_case(chunks, heads, kv_heads, head_dim, dtype), window)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 40), (4, 1, 256)])
@pytest.mark.parametrize("window", [0, 700])
def test_long_contexts_cross_the_value_blocks_to_the_bit(lib, heads: int, kv_heads: int, head_dim: int,
                                                         window: int) -> None:
    """The value side walks the keys in blocks of 65,536 / head_dim (each output's sums carried from block to block):
    contexts of several blocks, a window that starts inside one, still give the decode kernel's result bit for bit."""
    chunks = [(3300, 20), (1700, 9)]
    case = prefill_case(chunks, heads, kv_heads, head_dim, torch.bfloat16, num_blocks=320)
    assert_prefill_is_per_token_decode(lib, case, window)


def test_large_scores_do_not_overflow(lib) -> None:
    q, cache, tables, lens_t = case([50], 2, 1, 16)
    out = paged_decode_cpu(lib, q * 1e3, cache, tables, context_lens=lens_t, block_size=16,
        scale=1.0)  # scores ~1e4: softmax needs its max
    assert torch.isfinite(out).all()
    assert (out - paged_decode_cpu_ref(q * 1e3, cache, tables, lens_t, block_size=16, scale=1.0)).abs().max().item() < 1e-4


def test_supports_only_what_it_computes() -> None:
    q, cache, *_ = case([4], 9, 3, 64)
    assert supports(q, cache)
    assert supports(q, cache.bfloat16())  # a bf16 cache is read as bf16
    assert not supports(q.bfloat16(), cache.bfloat16())  # bf16 queries (a bf16 model) keep the torch path
    assert not supports(q, cache.half())
    assert not supports(q[..., :12], cache[..., :12])  # head_dim not a multiple of 8
    assert not supports(torch.randn(1, 34, 64), torch.randn(2, 16, 2, 64))  # 17 query heads per KV head


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_matches_index_copy(lib, dtype: torch.dtype) -> None:
    """The companion store: strided K/V rows into their slots, bf16 rounded as .to() rounds, slot -1 skipped."""
    n, kv_heads, d = 5, 3, 64
    qkv = torch.randn(n, (3 + 2 * kv_heads) * d)
    qkv[0, 3 * 64] = float("nan")  # in v
    k = torch.randn(n, kv_heads, d)
    v = qkv[:, 3 * d : (3 + kv_heads) * d].view(n, kv_heads, d)  # strided rows, as the fused qkv split gives them
    slots = torch.tensor([7, 0, -1, 33, 2])
    cache = torch.zeros(2, 40, kv_heads, d, dtype=dtype)
    ref = cache.clone()
    store_kv_cpu(lib, k, v, cache, slot_mapping=slots)
    keep = slots >= 0
    ref[0].index_copy_(0, slots[keep], k[keep].to(dtype))
    ref[1].index_copy_(0, slots[keep], v[keep].to(dtype))
    torch.testing.assert_close(cache, ref, rtol=0, atol=0, equal_nan=True)  # bit for bit, NaN as NaN
