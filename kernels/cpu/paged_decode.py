"""Paged decode attention on x86 CPUs (AVX2 + FMA; fp32 or bf16 KV cache): the C kernel in paged_decode.h, built as
paged_decode.c (AVX2) or paged_decode_avx512.c (the prefill tiles on 512-bit vectors; the same bits).

    lib = load_paged_decode(build_dir)     # None where it cannot run (kernels/cpu/build.py says why)
    out = paged_decode_cpu(lib, q, cache, block_tables, context_lens, block_size, scale, window=0)
    ref = paged_decode_cpu_ref(q, cache, block_tables, context_lens, block_size, scale, window=0)
    store_kv_cpu(lib, k, v, cache, slot_mapping)   # this step's K/V into their slots (the companion kernel)
    out = paged_prefill_cpu(lib, q, cache, block_tables, cu_seqlens_q, context_lens, block_size, scale)  # chunks

One query token per sequence against its whole context, read through the block table: each (sequence, KV
head) task reads its keys and values once for the query heads that share them (GQA), with an exact
two-pass softmax in fp32 (a bf16 cache is read as bf16 and widened in registers). It replaces the torch path's
block gather + masked SDPA (two passes over the context and ~8 ops per layer) on the CPU. Cache: (2, slots,
kv_heads, head_dim), slot = block * block_size + offset, as backend/model/attention.py stores it.

`paged_prefill_cpu` attends prefill chunks: each query token exactly as `paged_decode_cpu` would attend it as a decode
query over its causal prefix, or its sliding window (bit for bit: batch invariance), computed in tiles of consecutive
tokens that share each key and value they read.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu.build import cpu_isa, load_c_kernel

SOURCES = {"avx2": Path(__file__).with_suffix(".c"), "avx512": Path(__file__).with_name("paged_decode_avx512.c")}
MAX_GROUP, MAX_HEAD_DIM = 16, 256  # the C kernel's register/stack arrays


def load_paged_decode(build_dir: Path, isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot run. isa: "avx2" or "avx512"; by default the best this CPU runs
    (x86 only: on aarch64 there is none)."""
    lib = load_c_kernel(SOURCES.get(isa or cpu_isa(), SOURCES["avx2"]), Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.paged_decode.argtypes = [
            p, p, p, p, i64, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, p, i64, p, ctypes.c_int, ctypes.c_int,
        ]
        lib.paged_decode.restype = None
        lib.paged_prefill.argtypes = [
            p, p, p, p, i64, p, p, i64, i64, i64, i64, i64, i64, ctypes.c_float, p, i64, p, ctypes.c_int, ctypes.c_int,
        ]
        lib.paged_prefill.restype = None
        lib.prefill_scratch_floats.argtypes = [i64, i64, i64, i64, i64, i64, i64]
        lib.prefill_scratch_floats.restype = i64
        lib.store_kv.argtypes = [p, i64, p, i64, p, p, p, i64, i64, ctypes.c_int]
        lib.store_kv.restype = None
    return lib


def supports(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """Whether the kernel takes these shapes and dtypes (else the caller uses its torch path)."""
    heads, head_dim = q.shape[1:]
    return q.device.type == "cpu" and supports_dims(heads, cache.shape[2], head_dim, q.dtype, cache_dtype=cache.dtype)


def supports_dims(heads: int, kv_heads: int, head_dim: int, q_dtype: torch.dtype, *, cache_dtype: torch.dtype) -> bool:
    """`supports` for a model's attention before any tensor exists (CPU tensors)."""
    return (q_dtype == torch.float32 and cache_dtype in (torch.float32, torch.bfloat16) and head_dim % 8 == 0
            and head_dim <= MAX_HEAD_DIM and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP)


def paged_decode_cpu(
    lib: ctypes.CDLL, q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, *, context_lens: torch.Tensor,
    block_size: int, scale: float, window: int = 0, max_len: int = 0,
) -> torch.Tensor:
    """q (n, heads, head_dim) float32 -> (n, heads, head_dim); cache (2, slots, kv_heads, head_dim) float32 or bfloat16.
    max_len: max(context_lens) if the caller knows it (saves reading it back from the tensor every layer)."""
    n, heads, head_dim = q.shape
    kv_heads = cache.shape[2]
    assert supports(q, cache), "fp32 CPU q, fp32/bf16 cache, head_dim % 8 == 0, at most 16 query heads per KV head"
    assert cache.shape[0] == 2 and cache.shape[3] == head_dim and cache.is_contiguous()
    assert block_tables.dtype == context_lens.dtype == torch.int32 and block_tables.shape[0] == context_lens.shape[0] == n
    q, tables = q.contiguous(), block_tables.contiguous()
    max_len = max_len or (int(context_lens.max()) if n else 0)
    threads = torch.get_num_threads()
    scores = torch.empty(threads * (heads // kv_heads + 1) * max_len)  # scratch per thread: scores per query head + slots
    out = torch.empty_like(q)
    lib.paged_decode(
        q.data_ptr(), cache[0].data_ptr(), cache[1].data_ptr(), tables.data_ptr(), tables.shape[1], context_lens.data_ptr(),
        n, heads, kv_heads, head_dim, block_size, window, scale, scores.data_ptr(), max_len, out.data_ptr(),
        int(cache.dtype == torch.bfloat16), threads,
    )
    return out


def paged_prefill_cpu(
    lib: ctypes.CDLL, q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, *, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_size: int, scale: float, window: int = 0, max_len: int = 0,
) -> torch.Tensor:
    """q (tokens, heads, head_dim) float32, the chunks packed (chunk i's rows cu_seqlens_q[i]:cu_seqlens_q[i + 1]),
    -> (tokens, heads, head_dim): every row as `paged_decode_cpu` attends a decode query seeing its chunk's earlier
    context and itself (row j of chunk i: context_lens[i] - its chunk's length + 1 + j tokens; with `window` > 0 the
    last `window` of them). block_tables (chunks, max_blocks) and context_lens (chunks,) int32, the tokens in the cache
    after the chunk."""
    n, heads, head_dim = q.shape
    kv_heads = cache.shape[2]
    assert supports(q, cache), "fp32 CPU q, fp32/bf16 cache, head_dim % 8 == 0, at most 16 query heads per KV head"
    assert cache.shape[0] == 2 and cache.shape[3] == head_dim and cache.is_contiguous()
    assert block_tables.dtype == context_lens.dtype == cu_seqlens_q.dtype == torch.int32
    assert cu_seqlens_q.shape[0] == context_lens.shape[0] + 1 == block_tables.shape[0] + 1
    q, tables, cu = q.contiguous(), block_tables.contiguous(), cu_seqlens_q.contiguous()
    max_len = max_len or (int(context_lens.max()) if n else 0)
    threads = torch.get_num_threads()
    total = int(context_lens.sum()) if n else 0
    # per thread its tile's scores, then the chunks' K/V widened to fp32 once (every tile of a chunk reads them all)
    scratch = torch.empty(lib.prefill_scratch_floats(heads // kv_heads, kv_heads, head_dim, max_len, total, len(context_lens),
                                                      threads))
    out = torch.empty_like(q)
    lib.paged_prefill(
        q.data_ptr(), cache[0].data_ptr(), cache[1].data_ptr(), tables.data_ptr(), tables.shape[1], cu.data_ptr(),
        context_lens.contiguous().data_ptr(), context_lens.shape[0], heads, kv_heads, head_dim, block_size, window,
        scale, scratch.data_ptr(), max_len, out.data_ptr(), int(cache.dtype == torch.bfloat16), threads,
    )
    return out


def store_kv_cpu(lib: ctypes.CDLL, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, *, slot_mapping: torch.Tensor) -> None:
    """k, v (n, kv_heads, head_dim) float32 (rows may be strided) into cache (2, slots, kv_heads, head_dim) float32 or
    bfloat16 (rounded to nearest even, as .to() does) at slot_mapping (n,) int64; slot -1 is skipped."""
    n, kv_heads, head_dim = k.shape
    assert supports_store(k, v, cache) and slot_mapping.dtype == torch.int64 and slot_mapping.shape == (n,)
    lib.store_kv(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cache[0].data_ptr(), cache[1].data_ptr(),
                 slot_mapping.contiguous().data_ptr(), n, kv_heads * head_dim, int(cache.dtype == torch.bfloat16))


def supports_store(k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor) -> bool:
    def rows_of_heads(x: torch.Tensor) -> bool:
        return x.dtype == torch.float32 and x.stride(2) == 1 and x.stride(1) == x.shape[2]

    return (cache.dtype in (torch.float32, torch.bfloat16) and cache.is_contiguous() and rows_of_heads(k)
            and rows_of_heads(v) and k.shape == v.shape and k.shape[1:] == cache.shape[2:])


def paged_decode_cpu_ref(
    q: torch.Tensor, cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, *, block_size: int,
    scale: float, window: int = 0,
) -> torch.Tensor:
    """The same attention, one sequence at a time in plain torch."""
    heads, kv_heads = q.shape[1], cache.shape[2]
    out = torch.empty_like(q)
    for i, length in enumerate(context_lens.tolist()):
        t = torch.arange(max(0, length - window) if window else 0, length)
        slots = block_tables[i, t // block_size].long() * block_size + t % block_size
        k = cache[0, slots].float().repeat_interleave(heads // kv_heads, dim=1)  # (ctx, heads, head_dim)
        v = cache[1, slots].float().repeat_interleave(heads // kv_heads, dim=1)
        p = torch.softmax(torch.einsum("hd,thd->ht", q[i], k) * scale, dim=-1)
        out[i] = torch.einsum("ht,thd->hd", p, v)
    return out
