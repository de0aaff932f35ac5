"""DecodeStack: a decode step's decoder layers in one C call, for models whose projections all run on one of the CPU's
integer GEMMs.

At one sequence ~40% of an INT4 decode step was Python and torch dispatch around the C kernels (11 ctypes
calls, ~12 allocations and ~20 views a layer; Gemma 3, with QK-norm and four norms a layer, more).
kernels/cpu/decode_layers.c runs the same kernels in the same order from a single call, so the logits are
bit-identical to the layer-by-layer path; it is what CUDA graphs do for the GPU path's launches.

    model.decode_stack = DecodeStack.build(model, ops)    # None where it does not apply
    if model.decode_stack and model.decode_stack.takes(batch, residual, kv_cache): ...

It applies with CpuOps (the C kernels built) and fp32 norms, where every projection has no bias and is either an
Int4Linear on the W4A8 kernel with no act-order permutation (AWQ checkpoints) or a GgufLinear on the grouped W8A8
kernel with no padding rows (a GGUF's own blocks: Q4_0 ... Q8_0, the K-quants); the block may have QK-norm, sandwich
norms, GeGLU and a rope table per layer type (Gemma 3), not partial rotary. Batches of decode tokens only (prefill
chunks and speculative verification run layer by layer).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from backend.config import cache_dir
from backend.model.forward_batch import ForwardBatch, LayerCaches
from backend.model.llama import DecoderLayer, LlamaForCausalLM, RMSNorm
from backend.model.ops import CpuOps, Ops
from backend.quant.gguf_linear import GgufLinear
from backend.quant.int4_linear import Int4Linear
from kernels.cpu.decode_layers import (
    DecodeLayers,
    Dims,
    LayerWeights,
    PoolView,
    Projection,
    entry_points,
    load_decode_layers,
)
from kernels.cpu.wg8a8 import PackedGrouped


class DecodeStack:
    def __init__(self, layers: DecodeLayers) -> None:
        self.layers = layers

    @classmethod
    def build(cls, model: LlamaForCausalLM, ops: Ops | None) -> DecodeStack | None:
        arch = model.arch
        if (not isinstance(ops, CpuOps) or not model.layers or arch.qkv_bias or arch.rotary_fraction != 1.0
                or arch.activation not in ("silu", "gelu_tanh") or len(model.ropes) > 2):
            return None
        first = model.layers[0]
        gemm = _gemm_lib(first)
        if gemm is None or not all(_gemm_lib(layer) is gemm and _fp32_norms(layer) for layer in model.layers):
            return None
        lib = load_decode_layers(cache_dir() / "kernels")
        if lib is None or model.head_dim % 16 or first.mlp.intermediate % 8:
            return None
        attn = first.self_attn
        dims = Dims(first.input_layernorm.weight.shape[0], attn.num_heads, attn.num_kv_heads, model.head_dim,
                    first.mlp.intermediate, first.input_layernorm.eps, attn.scale, int(arch.activation == "gelu_tanh"))
        on_w4a8 = isinstance(first.mlp.down_proj, Int4Linear)
        kernels = entry_points(ops.elementwise, ops.decode_kernel, **{"w4a8" if on_w4a8 else "wg8a8": gemm})
        return cls(DecodeLayers(lib, kernels, dims, [_weights(layer) for layer in model.layers]))

    def takes(self, batch: ForwardBatch, residual: torch.Tensor | None, kv_cache: LayerCaches) -> bool:
        """A batch of decode tokens from the start of the stack, on caches the kernels read."""
        windowed = batch.windowed
        caches = [kv_cache] if isinstance(kv_cache, torch.Tensor) else kv_cache
        return (batch.prefill is None and batch.decode is not None and residual is None
                and (windowed is None or windowed.decode is not None)
                and all(c.dtype in (torch.float32, torch.bfloat16) and c.is_contiguous() for c in caches))

    def __call__(
        self, x: torch.Tensor, ropes: list[torch.Tensor], batch: ForwardBatch, kv_cache: LayerCaches
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (tokens, hidden) embeddings, ropes CpuOps' tables (the model's, in its order) -> (last layer's output,
        residual stream)."""
        views = [_view(batch)] + ([_view(batch.windowed)] if batch.windowed is not None else [])
        caches = list(kv_cache)  # one tensor over the layers, or each layer's own
        return self.layers(x, ropes, views, caches, block_size=batch.block_size)


def _view(batch: ForwardBatch) -> PoolView:
    meta = batch.decode
    assert meta is not None
    max_len = meta.max_context_len or int(meta.context_lens.max())
    return PoolView(meta.block_tables.contiguous(), meta.context_lens.contiguous(), max_len,
                    batch.slot_mapping.contiguous())


def _projections(layer: DecoderLayer) -> tuple[nn.Module, nn.Module, nn.Module, nn.Module]:
    return layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj


def _gemm_lib(layer: DecoderLayer) -> ctypes.CDLL | None:
    """The one C GEMM library every projection of the layer runs on, where there is one: the W4A8 kernel's (AWQ, no
    bias, no act-order permutation) or the grouped W8A8 kernel's (a GGUF's blocks, no padding rows)."""
    projections = _projections(layer)
    if all(type(p) is Int4Linear and p.mode == "w4a8" and p.bias is None and p.in_perm is None for p in projections):
        libs = {id(p.w4a8_lib): p.w4a8_lib for p in projections}
    elif all(type(p) is GgufLinear and p.mode == "wg8a8" and isinstance(p.weight_q, PackedGrouped)
             and p.weight_q.padded == p.out_features for p in projections):
        libs = {id(p.lib): p.lib for p in projections}
    else:
        return None
    return next(iter(libs.values())) if len(libs) == 1 else None


def _norms(layer: DecoderLayer) -> list[RMSNorm | None]:
    attn = layer.self_attn
    return [layer.input_layernorm, layer.post_attention_layernorm, attn.q_norm, attn.k_norm,
            layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm]


def _fp32_norms(layer: DecoderLayer) -> bool:
    return all(n is None or n.weight.dtype == torch.float32 for n in _norms(layer))


def _weights(layer: DecoderLayer) -> LayerWeights:
    def kernel_weight(p: nn.Module) -> Projection:
        return p.w4a8 if isinstance(p, Int4Linear) else p.weight_q

    norms = [None if n is None else n.weight.detach().contiguous() for n in _norms(layer)]
    qkv, o, gate_up, down = map(kernel_weight, _projections(layer))
    return LayerWeights(
        norms[0], norms[1], qkv, o, gate_up, down, layer.self_attn.window, layer.rope_index, q_norm=norms[2],
        k_norm=norms[3], pre_ff_norm=norms[4], post_ff_norm=norms[5],
    )
