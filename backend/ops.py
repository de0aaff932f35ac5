"""The model's hot ops, in two implementations: plain torch (CPU, anywhere) and Triton kernels (CUDA).

The model calls `ops.rms_norm`, `ops.rotary` and `ops.attention` and never knows which one runs.
`select_ops("auto", device)` picks Triton on CUDA and torch elsewhere; "triton" on a CPU runs the
kernels through Triton's interpreter (slow; for tests), "torch" forces the torch path on a GPU.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from backend.attention import paged_attention
from backend.forward_batch import ForwardBatch


class Ops(Protocol):
    name: str

    def rms_norm(
        self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def rotary(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: torch.Tensor, batch: ForwardBatch, scale: float
    ) -> torch.Tensor: ...


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

    def rotary(self, q, k, positions, cos_sin):
        """cos_sin: (max_positions, head_dim) fp32, cos in the first half, sin in the second (rotate-half)."""
        half = cos_sin.shape[1] // 2
        cos, sin = cos_sin[positions].to(q.dtype).view(-1, 1, 2, half).unbind(2)  # (tokens, 1, half) each
        return _rotate(q, cos, sin, half), _rotate(k, cos, sin, half)

    def attention(self, q, k, v, cache, batch, scale):
        return paged_attention(q, k, v, cache, batch, scale)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int) -> torch.Tensor:
    """Rotate-half RoPE: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) over the two halves of head_dim."""
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TritonOps:
    """The kernels/ launchers; the KV cache (2, slots, kv_heads, d) is viewed as paged (blocks, bs, kv_heads, d)."""

    name = "triton"

    def __init__(self, block_size: int) -> None:
        from kernels import flash_prefill, kv_store, paged_decode, rmsnorm, rotary

        self.block_size = block_size
        self._store, self._decode = kv_store.store_kv, paged_decode.paged_decode
        self._prefill, self._norm, self._rotary = flash_prefill.flash_prefill, rmsnorm.rms_norm, rotary.rotary_embedding

    def rms_norm(self, x, weight, eps, residual):
        out, new_residual = self._norm(x, weight, eps, residual=residual)
        return out, x if residual is None else new_residual

    def rotary(self, q, k, positions, cos_sin):
        return self._rotary(positions, q, k, cos_sin)

    def attention(self, q, k, v, cache, batch, scale):
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


def select_ops(backend: str, device: str, block_size: int) -> Ops:
    """backend: auto | torch | triton."""
    if backend not in {"auto", "torch", "triton"}:
        raise ValueError(f"unknown kernel backend {backend!r}: use auto, torch or triton")
    use_triton = backend == "triton" or (backend == "auto" and device.startswith("cuda"))
    if use_triton and not device.startswith("cuda"):
        import kernels

        kernels.use_interpreter()  # Triton on the CPU means the interpreter
    return TritonOps(block_size) if use_triton else TorchOps()
