"""The model's hot ops, in two implementations: plain torch (CPU, anywhere) and Triton kernels (CUDA).

The model calls `ops.rms_norm`, `ops.rope_table` (once per forward), `ops.rotary`, `ops.attention`,
`ops.silu_and_mul` and `ops.gelu_and_mul` and never knows which one runs.
`select_ops("auto", device)` picks Triton on CUDA, and on a CPU `CpuOps`: torch plus the project's C kernels where
they build (x86 AVX2 + a C compiler; kernels/cpu/paged_decode.h: K/V store and decode attention straight through
the block table instead of a block gather + masked SDPA; kernels/cpu/elementwise.c: RMSNorm + residual, RoPE,
SwiGLU, GeGLU), else plain torch; "triton" on a CPU runs the kernels through Triton's interpreter (slow; for tests),
"torch" forces the plain torch path anywhere.
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import torch
import torch.nn.functional as F

from backend.config import cache_dir
from backend.model.attention import paged_attention
from backend.model.forward_batch import ForwardBatch
from kernels.cpu.elementwise import (
    gelu_tanh_and_mul,
    load_elementwise,
    norm_supported,
    rms_norm_residual,
    rotary_neox,
    rotary_supported,
    silu_and_mul,
    silu_supported,
)
from kernels.cpu.paged_decode import load_paged_decode
from kernels.cpu.small_gemm import load_small_gemm


class Ops(Protocol):
    name: str

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rope_table(self, positions: torch.Tensor, cos_sin: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """What `rotary` needs for this forward's positions, built once and shared by every layer."""
        ...

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, table: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, *, batch: ForwardBatch, scale: float
    ) -> torch.Tensor: ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU: (tokens, 2I) [gate | up] -> silu(gate) * up."""
        ...

    def gelu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """GeGLU (Gemma): (tokens, 2I) [gate | up] -> gelu_tanh(gate) * up, as HF's gelu_pytorch_tanh."""
        ...


class TorchOps:
    name = "torch"

    def rms_norm(self, x, weight, eps, residual):
        """(normed, new residual): the residual add happens first, as in the reference model."""
        residual = x if residual is None else x + residual
        if residual.dtype == torch.float32:  # one fused op instead of seven (same arithmetic as HF's)
            return F.rms_norm(residual, weight.shape, weight, eps), residual
        h = residual.float()  # fp32 statistics whatever the model dtype
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(x.dtype), residual

    def rope_table(self, positions, cos_sin, dtype):
        """cos_sin: (max_positions, head_dim) fp32, cos in the first half, sin in the second (rotate-half).
        Returns (cos, cos) and (-sin, sin) side by side, each (tokens, 1, head_dim): then every layer rotates
        with one swap, two products and a sum, instead of re-gathering its angles and working half by half."""
        cos, sin = cos_sin[positions].to(dtype).chunk(2, dim=-1)  # (tokens, head_dim / 2) each
        return torch.cat((cos, cos), -1).unsqueeze(1), torch.cat((-sin, sin), -1).unsqueeze(1)

    def rotary(self, q, k, table):
        cos, signed_sin = table
        return _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)

    def attention(self, q, k, v, cache, *, batch, scale):
        return paged_attention(q, k, v, cache, batch=batch, scale=scale)

    def silu_and_mul(self, gate_up):
        return _silu_and_mul(gate_up)

    def gelu_and_mul(self, gate_up):
        return _gelu_and_mul(gate_up)


class CpuOps(TorchOps):
    """The torch ops with the C kernels where they take the tensors (fp32; else the torch path): decode attention
    (kernels/cpu/paged_decode.h), RMSNorm with its residual add, RoPE and SwiGLU's gate (kernels/cpu/elementwise.c)."""

    name = "cpu"

    def __init__(self, decode_kernel: ctypes.CDLL, elementwise: ctypes.CDLL, small_gemm: ctypes.CDLL | None = None) -> None:
        self.decode_kernel, self.elementwise = decode_kernel, elementwise
        self.small_gemm = small_gemm  # fp32 GEMM of 1..16 rows (kernels/cpu/small_gemm.c): the loader hands it to the linears

    def rms_norm(self, x, weight, eps, residual):
        if norm_supported(x) and (residual is None or norm_supported(residual)) and weight.dtype == torch.float32:
            return rms_norm_residual(self.elementwise, x, residual, weight, eps=eps)
        return super().rms_norm(x, weight, eps, residual)

    def rope_table(self, positions, cos_sin, dtype):
        """fp32: each position's [cos | sin] row, what the C kernel reads; else the torch path's table."""
        if dtype == torch.float32 and cos_sin.shape[-1] % 16 == 0:
            return cos_sin[positions].contiguous()  # (tokens, head_dim)
        return super().rope_table(positions, cos_sin, dtype)

    def rotary(self, q, k, table):
        if isinstance(table, torch.Tensor) and rotary_supported(q) and rotary_supported(k):
            return rotary_neox(self.elementwise, q, table), rotary_neox(self.elementwise, k, table)
        if isinstance(table, torch.Tensor):  # the C table, tensors the kernel cannot take: build the torch one
            table = super().rope_table(torch.arange(table.shape[0]), table, q.dtype)
        return super().rotary(q, k, table)

    def attention(self, q, k, v, cache, *, batch, scale):
        return paged_attention(q, k, v, cache, batch=batch, scale=scale, decode_kernel=self.decode_kernel)

    def silu_and_mul(self, gate_up):
        return silu_and_mul(self.elementwise, gate_up) if silu_supported(gate_up) else _silu_and_mul(gate_up)

    def gelu_and_mul(self, gate_up):
        return gelu_tanh_and_mul(self.elementwise, gate_up) if silu_supported(gate_up) else _gelu_and_mul(gate_up)


def _silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _gelu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the two halves of head_dim.

    x: (tokens, heads, head_dim). The halves swapped, (x2, x1), times (-sin, sin) is HF's rotate_half(x) * sin
    bit for bit (a negation is exact), so the result equals the reference's x * cos + rotate_half(x) * sin."""
    swapped = torch.roll(x, x.shape[-1] // 2, dims=-1)  # (x2, x1): one copy, faster than flip or cat here
    return x * cos + swapped * signed_sin


class TritonOps:
    """The kernels/ launchers; the KV cache (2, slots, kv_heads, d) is viewed as paged (blocks, bs, kv_heads, d)."""

    name = "triton"

    def __init__(self, block_size: int) -> None:
        from kernels.triton import flash_prefill, kv_store, paged_decode, rmsnorm, rotary

        self.block_size = block_size
        self._store, self._decode = kv_store.store_kv, paged_decode.paged_decode
        self._prefill, self._norm, self._rotary = flash_prefill.flash_prefill, rmsnorm.rms_norm, rotary.rotary_embedding

    def rms_norm(self, x, weight, eps, residual):
        out, new_residual = self._norm(x, weight, eps, residual=residual)
        return out, x if residual is None else new_residual

    def rope_table(self, positions, cos_sin, dtype):
        return positions, cos_sin  # the kernel gathers each token's angles itself

    def rotary(self, q, k, table):
        positions, cos_sin = table
        return self._rotary(positions, q, k, cos_sin)

    def attention(self, q, k, v, cache, *, batch, scale):
        kv_heads, head_dim = cache.shape[2:]
        k_cache = cache[0].view(-1, self.block_size, kv_heads, head_dim)  # (num_blocks, block_size, kv_heads, d)
        v_cache = cache[1].view(-1, self.block_size, kv_heads, head_dim)
        self._store(k, v, k_cache, v_cache, batch.slot_mapping)
        out = torch.empty_like(q)  # (num_tokens, num_heads, head_dim)
        d = batch.num_decode_tokens
        if batch.decode is not None:
            m = batch.decode
            self._decode(q[:d], k_cache, v_cache, m.block_tables, m.context_lens, scale=scale, out=out[:d], window=batch.window)
        if batch.prefill is not None:
            m = batch.prefill
            self._prefill(
                q[d:], k_cache, v_cache, m.block_tables, m.cu_seqlens_q, m.context_lens,
                max_query_len=m.query_index.shape[1], scale=scale, out=out[d:], window=batch.window,
            )
        return out

    def silu_and_mul(self, gate_up):
        return _silu_and_mul(gate_up)  # elementwise: torch's own CUDA kernel is already one pass

    def gelu_and_mul(self, gate_up):
        return _gelu_and_mul(gate_up)


def select_ops(backend: str, device: str, block_size: int) -> Ops:
    """backend: auto | torch | triton."""
    if backend not in {"auto", "torch", "triton"}:
        raise ValueError(f"unknown kernel backend {backend!r}: use auto, torch or triton")
    use_triton = backend == "triton" or (backend == "auto" and device.startswith("cuda"))
    if use_triton and not device.startswith("cuda"):
        import kernels

        kernels.use_interpreter()  # Triton on the CPU means the interpreter
    if use_triton:
        return TritonOps(block_size)
    if backend != "auto" or device != "cpu":
        return TorchOps()
    decode, elementwise = load_paged_decode(cache_dir() / "kernels"), load_elementwise(cache_dir() / "kernels")
    if decode is None or elementwise is None:
        return TorchOps()
    return CpuOps(decode, elementwise, load_small_gemm(cache_dir() / "kernels"))
