"""The decoder layer's small fused ops on x86 CPUs (AVX2 + FMA, fp32): the C kernels in elementwise.c.

    lib = load_elementwise(build_dir)                        # None where it cannot run (kernels/cpu/build.py)
    out, residual = rms_norm_residual(lib, x, residual, weight, eps)   # residual None: x is the stream
    q_rot = rotary_neox(lib, q, table)                       # q (M, H, D) rows may be strided; table (M, D) [cos | sin]
    h = silu_and_mul(lib, gate_up)                           # (M, 2I) -> silu(gate) * up, (M, I)
    h = gelu_tanh_and_mul(lib, gate_up)                      # (M, 2I) -> gelu_tanh(gate) * up, (M, I): GeGLU
    y = layer_norm_residual(lib, x, residual, weight, bias, eps)   # LayerNorm(x + residual), the BERT encoder's

Each replaces a chain of tiny torch ops (RMSNorm with its residual add ~7, rotate-half RoPE ~7 per tensor) with
one call: at one sequence a decode step's cost is mostly op dispatch, and so is an embedding of one short query.
References: `rms_norm_residual_ref`, `rotary_neox_ref`, `silu_and_mul_ref`, `gelu_tanh_and_mul_ref`,
`layer_norm_residual_ref`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch

from kernels.cpu.build import load_c_kernel

SOURCE = Path(__file__).with_suffix(".c")


def load_elementwise(build_dir: Path) -> ctypes.CDLL | None:
    lib = load_c_kernel(SOURCE, Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.rms_norm_residual.argtypes = [p, i64, p, i64, p, ctypes.c_float, i64, i64, p, p]
        lib.rotary_neox.argtypes = [p, i64, p, i64, i64, i64, p]
        lib.silu_and_mul.argtypes = lib.gelu_tanh_and_mul.argtypes = [p, i64, i64, i64, p]
        lib.layer_norm_residual.argtypes = [p, i64, p, i64, p, p, ctypes.c_float, i64, i64, p]
        lib.rms_norm_residual.restype = lib.rotary_neox.restype = lib.silu_and_mul.restype = None
        lib.gelu_tanh_and_mul.restype = None
        lib.layer_norm_residual.restype = None
    return lib


def norm_supported(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] % 8 == 0 and x.stride(1) == 1


def rotary_supported(x: torch.Tensor) -> bool:
    d = x.shape[-1]
    return x.dtype == torch.float32 and x.dim() == 3 and d % 16 == 0 and x.stride(2) == 1 and x.stride(1) == d


def silu_supported(x: torch.Tensor) -> bool:
    return x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] % 16 == 0 and x.stride(1) == 1


def silu_and_mul(lib: ctypes.CDLL, gate_up: torch.Tensor) -> torch.Tensor:
    """(M, 2I) float32 [gate | up] (rows may be strided) -> silu(gate) * up, (M, I)."""
    return _gated(lib.silu_and_mul, gate_up)


def gelu_tanh_and_mul(lib: ctypes.CDLL, gate_up: torch.Tensor) -> torch.Tensor:
    """(M, 2I) float32 [gate | up] (rows may be strided) -> gelu_tanh(gate) * up, (M, I): GeGLU (Gemma)."""
    return _gated(lib.gelu_tanh_and_mul, gate_up)


def _gated(kernel: Callable[..., None], gate_up: torch.Tensor) -> torch.Tensor:
    m, two_i = gate_up.shape
    assert silu_supported(gate_up), "float32 (M, 2I) with unit column stride, I a multiple of 8"
    out = torch.empty(m, two_i // 2)
    kernel(gate_up.data_ptr(), gate_up.stride(0), m, two_i // 2, out.data_ptr())
    return out


def rms_norm_residual(
    lib: ctypes.CDLL, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, *, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * norm(x + residual), x + residual); x, residual (M, D) float32 with unit column stride."""
    m, d = x.shape
    assert norm_supported(x) and weight.shape == (d,) and weight.dtype == torch.float32 and weight.is_contiguous()
    assert residual is None or (residual.shape == x.shape and norm_supported(residual))
    out, stream = torch.empty(m, d), torch.empty(m, d)
    res_ptr, res_ld = (residual.data_ptr(), residual.stride(0)) if residual is not None else (None, 0)
    lib.rms_norm_residual(x.data_ptr(), x.stride(0), res_ptr, res_ld, weight.data_ptr(), eps, m, d, out.data_ptr(),
                          stream.data_ptr())
    return out, stream


def layer_norm_residual(
    lib: ctypes.CDLL, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, *, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm(x + residual) * weight + bias, (M, D) float32; x, residual with unit column stride (rows may be
    strided), D a multiple of 8."""
    m, d = x.shape
    assert norm_supported(x), "x: float32 (M, D) with unit column stride, D a multiple of 8"
    assert residual is None or (residual.shape == x.shape and norm_supported(residual)), "residual: like x"
    for p in (weight, bias):
        assert p.shape == (d,) and p.dtype == torch.float32 and p.is_contiguous(), f"weight, bias: ({d},) float32"
    out = torch.empty(m, d)
    res_ptr, res_ld = (residual.data_ptr(), residual.stride(0)) if residual is not None else (None, 0)
    lib.layer_norm_residual(
        x.data_ptr(), x.stride(0), res_ptr, res_ld, weight.data_ptr(), bias.data_ptr(), eps, m, d, out.data_ptr()
    )
    return out


def rotary_neox(lib: ctypes.CDLL, x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """x (M, H, D) float32 (heads contiguous in a row, rows may be strided) -> rotated (M, H, D) contiguous."""
    m, h, d = x.shape
    assert rotary_supported(x), "float32 (M, H, D) with contiguous heads, D a multiple of 16"
    assert table.shape == (m, d) and table.dtype == torch.float32 and table.is_contiguous()
    out = torch.empty(m, h, d)
    lib.rotary_neox(x.data_ptr(), x.stride(0), table.data_ptr(), m, h, d, out.data_ptr())
    return out


def rms_norm_residual_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    stream = x if residual is None else x + residual
    return weight * (stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps)), stream


def layer_norm_residual_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor, *, eps: float
) -> torch.Tensor:
    stream = x if residual is None else x + residual
    return torch.nn.functional.layer_norm(stream, (x.shape[-1],), weight, bias, eps)


def rotary_neox_ref(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    cos, sin = table[:, None].chunk(2, dim=-1)  # (M, 1, D / 2) each
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def gelu_tanh_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.gelu(gate, approximate="tanh") * up
