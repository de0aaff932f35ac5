"""The Llama family (Llama 2/3, SmolLM, Qwen2/3, Mistral) and Gemma 3 over a paged KV cache.

One forward runs every scheduled token of every sequence as one packed batch: linear layers
see (num_tokens, hidden); only attention knows about sequences, through ForwardBatch.
q/k/v and gate/up projections are fused into one matmul each (fewer, larger GEMMs on CPU).
Norms, rotary and attention go through `ops` (torch or Triton, see backend/model/ops.py); the
residual stream is carried beside the hidden state so a norm can fuse the residual add.
What an architecture changes in the block (QK-norm, sandwich norms, GeGLU, embedding scale, rope per layer type) is
one record, `Arch` (backend/model/arch.py), read from the config once.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn
from transformers import PretrainedConfig

from backend.model.arch import Arch, arch_of
from backend.model.forward_batch import ForwardBatch, LayerCaches
from backend.model.ops import Ops, TorchOps
from backend.model.rope import RotaryEmbedding
from backend.model.sliding_window import layer_windows


class FusedLayers(Protocol):
    """Every decoder layer of a step in one call, where it applies (backend/model/decode_stack.py's DecodeStack, which
    the loader sets; typed here by what the model calls, so the model does not import its optional fast path)."""

    def takes(self, batch: ForwardBatch, residual: torch.Tensor | None, kv_cache: LayerCaches) -> bool: ...

    def __call__(
        self, x: torch.Tensor, ropes: list[torch.Tensor], batch: ForwardBatch, kv_cache: LayerCaches
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def rotary_dim(head_dim: int, arch: Arch) -> int:
    """The dims of each head the rotary turns (HF's int(head_dim * partial_rotary_factor))."""
    return int(head_dim * arch.rotary_fraction)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, ops: Ops) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        return ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, window: int = 0, arch: Arch | None = None) -> None:
        super().__init__()
        arch = arch or arch_of(config)
        self.window = window  # sliding window in tokens, 0 = full attention (backend/model/sliding_window.py)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.scale = arch.attn_scale or head_dim**-0.5
        self.rotary_dim = rotary_dim(head_dim, arch)
        # QK-norm (Qwen3, Gemma 3): each head's q and k normalised over head_dim before the rotary
        self.q_norm = RMSNorm(head_dim, config.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(head_dim, config.rms_norm_eps) if arch.qk_norm else None

    def forward(  # noqa: PLR0917  # a module's forward: called through the module, positionally
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: torch.Tensor, batch: ForwardBatch, ops: Ops
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim), None, ops)[0]
            k = self.k_norm(k.reshape(-1, self.head_dim), None, ops)[0]
        q = q.reshape(n, self.num_heads, self.head_dim)  # (num_tokens, num_heads, head_dim)
        k = k.reshape(n, self.num_kv_heads, self.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        if self.rotary_dim == self.head_dim:
            q, k = ops.rotary(q, k, rope)
        else:  # partial rotary (Phi-4-mini): the first rotary_dim dims of each head turn, the rest pass unchanged
            d = self.rotary_dim
            q_rot, k_rot = ops.rotary(q[..., :d].contiguous(), k[..., :d].contiguous(), rope)
            q, k = torch.cat([q_rot, q[..., d:]], dim=-1), torch.cat([k_rot, k[..., d:]], dim=-1)
        batch = batch.with_window(self.window)
        out = ops.attention(q, k, v.reshape(n, self.num_kv_heads, self.head_dim), cache, batch=batch, scale=self.scale)
        return self.o_proj(out.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig, activation: str = "silu") -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.activation = activation
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)  # (tokens, 2I)
        if self.activation == "gelu_tanh":  # GeGLU (Gemma): gelu(gate) * up, as HF's gelu_pytorch_tanh
            return self.down_proj(ops.gelu_and_mul(gate_up))
        return self.down_proj(ops.silu_and_mul(gate_up))  # (tokens, 2I) -> (tokens, I) -> (tokens, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int, window: int = 0, arch: Arch | None = None,
                 *, rope_index: int = 0) -> None:
        super().__init__()
        arch = arch or arch_of(config)
        self.rope_index = rope_index  # which of the model's rope tables this layer rotates with
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, head_dim, window, arch)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, arch.activation)
        # sandwich norms (Gemma 3): post_attention_layernorm normalises the attention output itself, then these two
        # come before and after the MLP
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if arch.sandwich_norms else None
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if arch.sandwich_norms else None

    def forward(  # noqa: PLR0917  # a module's forward: called through the module, positionally
        self, x: torch.Tensor, residual: torch.Tensor | None, rope: tuple[torch.Tensor, torch.Tensor], cache: torch.Tensor,
        batch: ForwardBatch, ops: Ops,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: this layer's input delta, residual: the stream so far. Returns (mlp output, stream)."""
        h, residual = self.input_layernorm(x, residual, ops)
        if self.pre_feedforward_layernorm is None or self.post_feedforward_layernorm is None:
            h, residual = self.post_attention_layernorm(self.self_attn(h, rope, cache, batch, ops), residual, ops)
            return self.mlp(h, ops), residual
        a = self.post_attention_layernorm(self.self_attn(h, rope, cache, batch, ops), None, ops)[0]
        h, residual = self.pre_feedforward_layernorm(a, residual, ops)  # stream += normed attention output
        return self.post_feedforward_layernorm(self.mlp(h, ops), None, ops)[0], residual


class LlamaForCausalLM(nn.Module):
    """layer_ids: the decoder layers this model holds (all by default; a pipeline stage holds a contiguous range,
    backend/model/pipeline_parallel.py). ends: whether it holds the embeddings, the final norm and the lm_head."""

    def __init__(
        self, config: PretrainedConfig, max_positions: int, ops: Ops | None = None, layer_ids: range | None = None,
        *, ends: bool = True,
    ) -> None:
        super().__init__()
        self.config = config
        self.arch = arch_of(config)
        self.ops: Ops = ops or TorchOps()
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.layer_ids = layer_ids if layer_ids is not None else range(config.num_hidden_layers)
        self.layer_windows = layer_windows(config)  # every layer's, 0 = full attention: the batch masks cover all
        # rope tables: one, or (Gemma 3) one per layer type, each layer naming its own
        self.rope_types: list[str | None] = sorted(set(config.layer_types)) if self.arch.rope_by_layer_type else [None]
        kinds = [self.rope_types.index(config.layer_types[i]) if self.arch.rope_by_layer_type else 0
                 for i in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(
            DecoderLayer(config, self.head_dim, self.layer_windows[i], self.arch, rope_index=kinds[i]) for i in self.layer_ids)
        # No initial values: the loader assigns the checkpoint's (and on the meta device, nn.Embedding's normal_ runs a
        # Python decomposition that imports torch._dynamo and sympy: 72 MB resident for nothing)
        shape = (config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(*shape, _weight=torch.empty(shape)) if ends else None
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if ends else None
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False) if ends else None
        if ends and config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.set_rope(max_positions)
        self.decode_stack: FusedLayers | None = None  # all layers of a decode step in one C call (set by the loader)

    def set_rope(self, max_positions: int, device: torch.device | str = "cpu") -> None:
        """The rope tables (fp32 whatever the model's dtype: the loader calls this after casting)."""
        dim = rotary_dim(self.head_dim, self.arch)
        ropes = [RotaryEmbedding(self.config, dim, max_positions, t, device=device) for t in self.rope_types]
        self.rope, self.ropes = ropes[0], nn.ModuleList(ropes)

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)  # (num_tokens, hidden)
        if self.arch.embed_scale is not None:  # in the model's dtype, as the reference rounds it
            x = x * torch.tensor(self.arch.embed_scale, dtype=x.dtype)
        return x

    def run_layers(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch, kv_cache: LayerCaches
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This model's decoder layers; kv_cache[i] belongs to self.layers[i]. Returns (last delta, stream)."""
        end = batch.positions_end() if any(r.filled < r.max_positions for r in self.ropes) else 0
        for r in self.ropes:
            r.cover(end)  # a CPU table computes the rows this batch's positions reach, once
        ropes = [self.ops.rope_table(batch.positions, r.cos_sin, x.dtype) for r in self.ropes]  # shared by the layers
        if self.decode_stack is not None and self.decode_stack.takes(batch, residual, kv_cache):
            return self.decode_stack(x, ropes, batch, kv_cache)  # the same kernels, from C (backend/model/decode_stack.py)
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, ropes[layer.rope_index], kv_cache[i], batch, self.ops)
        return x, residual

    def final_norm(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """The final hidden states the lm_head reads (Medusa heads read them too), over the logits rows."""
        x, _ = self.norm(x, residual, self.ops)
        return x

    def head(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Final norm and lm_head over rows already narrowed to the logits rows. (rows, vocab) fp32 logits."""
        return self.lm_head(self.final_norm(x, residual)).float()

    def forward(self, batch: ForwardBatch, kv_cache: LayerCaches) -> torch.Tensor:
        """kv_cache: each layer's (2, num_slots, kv_heads, head_dim). Returns (num_logit_rows, vocab) fp32 logits."""
        x, residual = self.run_layers(self.embed(batch), None, batch, kv_cache)
        rows = batch.logits_index  # only rows whose logits are needed
        return self.head(x[rows], residual[rows])

    def hidden_states(self, batch: ForwardBatch, kv_cache: LayerCaches) -> torch.Tensor:
        """(num_logit_rows, hidden): the final hidden states (after the final norm) of the logits rows."""
        x, residual = self.run_layers(self.embed(batch), None, batch, kv_cache)
        rows = batch.logits_index
        return self.final_norm(x[rows], residual[rows])
