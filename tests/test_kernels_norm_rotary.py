"""kernels/triton/rmsnorm.py and kernels/triton/rotary.py against their torch references, under Triton's interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by @triton.jit when the kernel module is imported

import pytest
import torch

from kernels.triton import rmsnorm, rotary
from kernels.triton.testing import assert_close, device_for, generator, poison, ready

ready(rmsnorm)
ready(rotary)
DEV = device_for(rmsnorm)
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("num_tokens,hidden", [(1, 576), (7, 100)])
def test_rms_norm(dtype, with_residual, num_tokens, hidden):
    g = generator("rms", dtype, with_residual, num_tokens, hidden)
    base = torch.randn(num_tokens, hidden + 3, generator=g).to(dtype).to(DEV)
    x = base[:, :hidden]  # a row stride != hidden
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(DEV)
    res = (torch.randn(num_tokens, hidden, generator=g) * 2).to(dtype).to(DEV) if with_residual else None
    out = poison(num_tokens, hidden, dtype=dtype, device=DEV)
    res_out = poison(num_tokens, hidden, dtype=dtype, device=DEV) if with_residual else None
    y, h = rmsnorm.rms_norm(x, w, 1e-5, residual=res, out=out, residual_out=res_out)
    y_ref, h_ref = rmsnorm.rms_norm_ref(x, w, 1e-5, residual=res)
    assert y is out
    assert_close(y, y_ref, dtype, scale=2)  # + one rounding of the weight product (documented)
    if with_residual:
        # exact, except that Triton 3.9's interpreter rounds float32 -> bfloat16 toward zero (a GPU rounds to
        # nearest even), so allow one bf16 ulp there
        torch.testing.assert_close(h, h_ref, atol=0, rtol=2**-7 if dtype == torch.bfloat16 else 0)
    else:
        assert h is None


def test_rms_norm_in_place_residual():
    g = generator("rms-inplace")
    x, res = torch.randn(2, 5, 64, generator=g).to(DEV)
    w = torch.randn(64, generator=g).to(DEV)
    expected_y, expected_h = rmsnorm.rms_norm_ref(x, w, 1e-6, residual=res)
    y, h = rmsnorm.rms_norm(x, w, 1e-6, residual=res, residual_out=res)
    assert h is res
    assert_close(h, expected_h)
    assert_close(y, expected_y)


def test_rms_norm_reference_against_torch():
    g = generator("rms-ref")
    x = torch.randn(4, 96, generator=g, dtype=torch.float64)
    w = torch.randn(96, generator=g, dtype=torch.float64)
    ref, _ = rmsnorm.rms_norm_ref(x, w, 1e-5)
    torch.testing.assert_close(ref, torch.nn.functional.rms_norm(x, (96,), w, eps=1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
# 96 and 12: a partial rotary's widths (Phi-4-mini turns 96 of 128 dims), no power of two
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(9, 3, 64), (4, 1, 128), (3, 1, 96), (2, 2, 12)])
@pytest.mark.parametrize("inplace", [False, True])
def test_rotary(dtype, num_heads, num_kv_heads, head_dim, inplace):
    g = generator("rope", dtype, num_heads, num_kv_heads, head_dim, inplace)
    num_tokens, max_pos = 5, 300
    cache = rotary.rope_cache(head_dim, max_pos, base=100000.0).to(DEV)
    positions = torch.tensor([0, 1, 299, 17, 17], dtype=torch.int64).to(DEV)
    # q and k as views into a fused qkv output (token stride != heads * head_dim)
    qkv = torch.randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, generator=g).to(dtype).to(DEV)
    q, k = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads]
    q_ref, k_ref = rotary.rotary_embedding_ref(positions, q, k, cache)
    v_before = qkv[:, num_heads + num_kv_heads:].clone()
    if inplace:
        q_out, k_out = rotary.rotary_embedding(positions, q, k, cache, inplace=True)
        assert q_out is q and k_out is k
    else:
        q_before, k_before = q.clone(), k.clone()
        q_out, k_out = rotary.rotary_embedding(positions, q, k, cache)
        assert torch.equal(q, q_before) and torch.equal(k, k_before)
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)
    assert torch.equal(qkv[:, num_heads + num_kv_heads:], v_before)  # v untouched


def test_rotary_poisoned_output_fully_written():
    g = generator("rope-poison")
    cache = rotary.rope_cache(64, 16).to(DEV)
    q = poison(3, 9, 64, dtype=torch.float16, device=DEV)
    q.copy_(torch.randn(3, 9, 64, generator=g))
    k = torch.randn(3, 3, 64, generator=g).half().to(DEV)
    q_out, k_out = rotary.rotary_embedding(torch.tensor([3, 0, 15]).to(DEV), q, k, cache)
    assert not q_out.isnan().any() and not k_out.isnan().any()


def test_rotary_reference_against_complex_rotation():
    """rotate_half pairs dims (i, i + d/2): rotating by pos * inv_freq_i is a complex multiplication."""
    g = generator("rope-ref")
    d, base = 64, 10000.0
    positions = torch.tensor([0, 5, 1000])
    x = torch.randn(3, 2, d, generator=g, dtype=torch.float64)
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(
        torch.ones(3, d // 2, dtype=torch.float64), positions[:, None] * inv_freq)[:, None, :]
    expected = torch.cat([z.real, z.imag], dim=-1)
    cache = rotary.rope_cache(d, 1001, base)
    got, _ = rotary.rotary_embedding_ref(positions, x.float(), x.float(), cache)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
