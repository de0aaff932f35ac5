"""kernels/triton/kv_store.py against its torch reference, under Triton's interpreter on the CPU."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by @triton.jit when the kernel module is imported

import pytest
import torch

from kernels.triton import kv_store as ks
from kernels.triton.testing import device_for, generator, ready

ready(ks)
DEV = device_for(ks)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_kv_heads,head_dim,block_size", [(3, 64, 16), (1, 128, 8), (2, 64, 5)])
def test_store_kv(dtype, num_kv_heads, head_dim, block_size):
    g = generator("kv_store", dtype, num_kv_heads, head_dim, block_size)
    num_blocks, num_tokens = 7, 13
    # key/value as strided views into a fused qkv buffer, like the engine's projection output
    qkv = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=g).to(dtype).to(DEV)
    key, value = qkv[:, num_kv_heads:2 * num_kv_heads], qkv[:, 2 * num_kv_heads:]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens].to(torch.int32)
    slots[[2, 7]] = -1  # padding tokens: must not be written
    slots = slots.to(DEV)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    v_cache = torch.full(shape, float("nan"), dtype=dtype, device=DEV)
    k_ref, v_ref = k_cache.clone(), v_cache.clone()

    ks.store_kv(key, value, k_cache, v_cache, slot_mapping=slots)
    ks.store_kv_ref(key, value, k_ref, v_ref, slot_mapping=slots)

    # bit-exact copy; untouched slots stay NaN in both (equal_nan compares them)
    torch.testing.assert_close(k_cache, k_ref, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(v_cache, v_ref, atol=0, rtol=0, equal_nan=True)
    written = (~k_cache.isnan()).all(-1).all(-1).flatten().nonzero().flatten()
    assert sorted(written.tolist()) == sorted(s for s in slots.tolist() if s >= 0)


def test_store_kv_reference_against_loop():
    """The reference against a plain per-token loop (independent of its fancy indexing)."""
    g = torch.Generator().manual_seed(0)
    key, value = torch.randn(2, 6, 2, 8, generator=g)
    slots = torch.tensor([5, -1, 0, 11, 3, 8])
    k_cache, v_cache = torch.zeros(2, 3, 4, 2, 8)
    k_loop, v_loop = k_cache.clone(), v_cache.clone()
    ks.store_kv_ref(key, value, k_cache, v_cache, slot_mapping=slots)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            k_loop.view(-1, 2, 8)[s], v_loop.view(-1, 2, 8)[s] = key[t], value[t]
    assert torch.equal(k_cache, k_loop) and torch.equal(v_cache, v_loop)
