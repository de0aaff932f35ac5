"""The fused elementwise C kernels (kernels/cpu/elementwise.c) against torch: RMSNorm and LayerNorm with their residual
add and SwiGLU's silu(g) * u within an ulp or two, rotate-half RoPE bit for bit (the engine's torch path included).
Skipped, saying why, where the C kernels cannot be built."""

from __future__ import annotations

import math

import pytest
import torch

from backend.model.ops import TorchOps
from kernels.cpu.elementwise import (
    gelu_tanh_and_mul,
    gelu_tanh_and_mul_ref,
    layer_norm_residual,
    layer_norm_residual_ref,
    load_elementwise,
    rms_norm_residual,
    rms_norm_residual_ref,
    rotary_neox,
    rotary_neox_ref,
    rotary_supported,
    silu_and_mul,
    silu_and_mul_ref,
)
from tests.c_kernels import build, requires_c_kernels

pytestmark = requires_c_kernels


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory):
    return build(load_elementwise, tmp_path_factory, "elementwise")


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize(("rows", "dim"), [(1, 576), (33, 64), (5, 8)])
def test_rms_norm_residual(lib, with_residual: bool, rows: int, dim: int) -> None:
    x = torch.randn(rows, dim * 2)[:, :dim]  # a strided view, as a split's half is
    residual = torch.randn(rows, dim) if with_residual else None
    weight = torch.randn(dim)
    out, stream = rms_norm_residual(lib, x, residual, weight, eps=1e-5)
    ref_out, ref_stream = rms_norm_residual_ref(x, residual, weight, 1e-5)
    assert torch.equal(stream, ref_stream)  # the residual add is exact
    torch.testing.assert_close(out, ref_out, rtol=3e-7, atol=1e-6)
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(ref_stream, (dim,), weight, 1e-5), rtol=3e-7, atol=1e-6)


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize(("rows", "dim"), [(1, 384), (10, 384), (33, 64), (5, 8)])
def test_layer_norm_residual(lib, with_residual: bool, rows: int, dim: int) -> None:
    x = torch.randn(rows, dim * 2)[:, :dim] * 3 + 2  # a strided view; an offset mean, as residual streams have
    residual = torch.randn(rows, dim + 8)[:, :dim] if with_residual else None
    weight, bias = torch.randn(dim), torch.randn(dim)
    out = layer_norm_residual(lib, x, residual, weight, bias=bias, eps=1e-12)
    torch.testing.assert_close(out, layer_norm_residual_ref(x, residual, weight, bias, eps=1e-12), rtol=1e-6, atol=2e-6)
    stream = (x if residual is None else x + residual).double()  # the add is exact in float32, then float64 throughout
    exact = torch.nn.functional.layer_norm(stream, (dim,), weight.double(), bias.double(), 1e-12)
    torch.testing.assert_close(out.double(), exact, rtol=1e-6, atol=2e-6)


def test_rotary_is_bit_exact(lib) -> None:
    rows, heads, kv_heads, d = 7, 9, 3, 64
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * d)
    q = qkv[:, : heads * d].view(rows, heads, d)  # strided rows, as the engine's fused qkv split gives them
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(rows, kv_heads, d)
    positions = torch.tensor([0, 1, 5, 100, 7, 3, 2048])
    angles = positions[:, None].float() * torch.rand(d // 2)[None]
    table = torch.cat((angles.cos(), angles.sin()), dim=-1)  # (rows, d): [cos | sin]
    assert rotary_supported(q) and rotary_supported(k)
    for x in (q, k):
        assert torch.equal(rotary_neox(lib, x, table), rotary_neox_ref(x, table))
    torch_ops = TorchOps()
    ref_q, ref_k = torch_ops.rotary(q, k, torch_ops.rope_table(torch.arange(rows), table, torch.float32))
    assert torch.equal(rotary_neox(lib, q, table), ref_q) and torch.equal(rotary_neox(lib, k, table), ref_k)


def test_launchers_check_shapes(lib) -> None:
    with pytest.raises(AssertionError):
        rotary_neox(lib, torch.randn(2, 3, 24), torch.randn(2, 24))  # D not a multiple of 16
    with pytest.raises(AssertionError):
        rms_norm_residual(lib, torch.randn(2, 12), None, torch.randn(12), eps=1e-5)
    with pytest.raises(AssertionError):
        layer_norm_residual(lib, torch.randn(2, 16), None, torch.randn(16), bias=torch.randn(8), eps=1e-5)  # bias (8,)
    with pytest.raises(AssertionError):
        layer_norm_residual(lib, torch.randn(2, 16), torch.randn(3, 16), torch.randn(16), bias=torch.randn(16), eps=1e-5)


@pytest.mark.parametrize("rows", [1, 9])
def test_silu_and_mul(lib, rows: int) -> None:
    gate_up = torch.randn(rows, 2 * 1536 + 16)[:, : 2 * 1536] * 8  # strided rows; large |g| exercises the clamps
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    out = silu_and_mul(lib, gate_up)
    torch.testing.assert_close(out, silu_and_mul_ref(gate_up), rtol=2e-6, atol=1e-6)
    assert abs(out[0, 0].item()) < 1e-30 and out[0, 1] == 100 * gate_up[0, 1537]  # silu(-100) ~ -4e-42


@pytest.mark.parametrize("rows", [1, 9])
def test_gelu_tanh_and_mul(lib, rows: int) -> None:
    """GeGLU's gate against the exact value (float64) and torch's F.gelu(approximate="tanh") * up: within a few ulps
    where the gate is not tiny, and where it is (g well below 0, gelu(g) ~ g e^(2z)) within 1e-7 of the largest |g u|:
    there float32's rounding of z moves e^(2z) by ~|2z| ulps, in torch's tanh as here, and torch's 1 + tanh is a multiple
    of float's spacing at 1."""
    gate_up = torch.randn(rows, 2 * 2048 + 16)[:, : 2 * 2048] * 4  # strided rows
    gate_up[0, :6] = torch.tensor([-100.0, 100.0, 0.0, -0.0, 1e-20, -7.5])
    out = gelu_tanh_and_mul(lib, gate_up)
    edges = torch.tensor([[-1e30, -12.0, -float("inf"), float("nan"), 1e30, float("inf"), 0, 0] + [1.0] * 8])
    edge_out, edge_ref = gelu_tanh_and_mul(lib, edges), gelu_tanh_and_mul_ref(edges)
    assert torch.equal(edge_out.isnan(), edge_ref.isnan())  # -inf and NaN gates give NaN, as torch's
    assert edge_out[0, :2].tolist() == [0.0, 0.0] and edge_out[0, :2].signbit().all()  # far below: -0, not g / 2e38
    assert edge_out[0, 4:6].tolist() == edges[0, 4:6].tolist()  # g itself far above, inf at inf
    gate, up = gate_up.double().chunk(2, dim=-1)
    z = math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
    exact = gate / (1 + torch.exp(-2 * z)) * up  # 0.5 g (1 + tanh(z)) without float64's own cancellation
    tail = 1e-7 * (gate * up).abs().max().item()
    torch.testing.assert_close(out.double(), exact, rtol=2e-6, atol=tail)
    torch.testing.assert_close(out, gelu_tanh_and_mul_ref(gate_up), rtol=2e-6, atol=tail)
    assert abs(out[0, 0].item()) < 1e-30 and out[0, 1] == 100 * gate_up[0, 2049]  # gelu(-100) ~ 0, gelu(100) = 100
