"""DecodeStack: a decode step's decoder layers in one C call, for INT4 models on the C kernels.

At one sequence ~40% of an INT4 decode step was Python and torch dispatch around the C kernels (11 ctypes
calls, ~12 allocations and ~20 views a layer). kernels/cpu/decode_layers.c runs the same kernels in the same
order from a single call, so the logits are bit-identical to the layer-by-layer path; it is what CUDA graphs
do for the GPU path's launches.

    model.decode_stack = DecodeStack.build(model, ops)    # None where it does not apply
    if model.decode_stack and model.decode_stack.takes(batch, residual, kv_cache): ...

It applies with CpuOps (the C kernels built), every projection an Int4Linear on the W4A8 kernel with no bias
and no act-order permutation (AWQ checkpoints), fp32 norms and a head size the kernels take; batches of
decode tokens only (prefill chunks and speculative verification run layer by layer).
"""

from __future__ import annotations

import torch

from backend.config import cache_dir
from backend.model.forward_batch import ForwardBatch, LayerCaches
from backend.model.llama import DecoderLayer, LlamaForCausalLM
from backend.model.ops import CpuOps, Ops
from backend.quant.int4_linear import Int4Linear
from kernels.cpu.decode_layers import DecodeLayers, Dims, LayerWeights, entry_points, load_decode_layers


class DecodeStack:
    def __init__(self, layers: DecodeLayers) -> None:
        self.layers = layers

    @classmethod
    def build(cls, model: LlamaForCausalLM, ops: Ops | None) -> DecodeStack | None:
        if not isinstance(ops, CpuOps) or not model.layers or not all(_on_w4a8(layer) for layer in model.layers):
            return None
        lib = load_decode_layers(cache_dir() / "kernels")
        first = model.layers[0]
        if lib is None or model.head_dim % 16 or first.mlp.intermediate % 8:
            return None
        attn = first.self_attn
        dims = Dims(first.input_layernorm.weight.shape[0], attn.num_heads, attn.num_kv_heads, model.head_dim,
                    first.mlp.intermediate, first.input_layernorm.eps, attn.scale)
        kernels = entry_points(first.mlp.down_proj.w4a8_lib, ops.elementwise, ops.decode_kernel)
        return cls(DecodeLayers(lib, kernels, dims, [_weights(layer) for layer in model.layers]))

    def takes(self, batch: ForwardBatch, residual: torch.Tensor | None, kv_cache: LayerCaches) -> bool:
        """A batch of decode tokens from the start of the stack, on one cache tensor the kernels read."""
        return (batch.prefill is None and batch.decode is not None and residual is None
                and isinstance(kv_cache, torch.Tensor) and kv_cache.dtype in (torch.float32, torch.bfloat16))

    def __call__(
        self, x: torch.Tensor, rope: torch.Tensor, batch: ForwardBatch, kv_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (tokens, hidden) embeddings, rope CpuOps' table -> (last layer's output, residual stream)."""
        meta = batch.decode
        assert meta is not None
        max_len = meta.max_context_len or int(meta.context_lens.max())
        return self.layers(
            x, rope, block_tables=meta.block_tables, context_lens=meta.context_lens, max_len=max_len,
            slot_mapping=batch.slot_mapping, kv_cache=kv_cache, block_size=batch.block_size,
        )


def _on_w4a8(layer: DecoderLayer) -> bool:
    projections = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
    return (all(type(p) is Int4Linear and p.mode == "w4a8" and p.bias is None and p.in_perm is None for p in projections)
            and all(w.dtype == torch.float32 for w in norms))


def _weights(layer: DecoderLayer) -> LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return LayerWeights(
        layer.input_layernorm.weight.detach().contiguous(), layer.post_attention_layernorm.weight.detach().contiguous(),
        attn.qkv_proj.w4a8, attn.o_proj.w4a8, mlp.gate_up_proj.w4a8, mlp.down_proj.w4a8, attn.window,
    )
