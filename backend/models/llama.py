"""The Llama family (Llama 2/3, SmolLM, Qwen2, Mistral) over a paged KV cache.

One forward runs every scheduled token of every sequence as one packed batch: linear layers
see (num_tokens, hidden); only attention knows about sequences, through ForwardBatch.
q/k/v and gate/up projections are fused into one matmul each (fewer, larger GEMMs on CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from backend.attention import paged_attention
from backend.forward_batch import ForwardBatch
from backend.models.rope import RotaryEmbedding, apply_rotary

CosSin = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Computed in fp32 whatever the model dtype, as the reference implementation does.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.q_size, self.kv_size = self.num_heads * head_dim, self.num_kv_heads * head_dim
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.scale = head_dim**-0.5

    def forward(self, x: torch.Tensor, cos_sin: CosSin, cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)  # (num_tokens, num_heads, head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)  # (num_tokens, num_kv_heads, head_dim)
        q, k = apply_rotary(q, k, cos_sin)
        out = paged_attention(q, k, v.view(n, self.num_kv_heads, self.head_dim), cache, batch, self.scale)
        return self.o_proj(out.reshape(n, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, head_dim: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, head_dim)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos_sin: CosSin, cache: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, cache, batch)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: PretrainedConfig, max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, self.head_dim) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(config, self.head_dim, max_positions)

    def forward(self, batch: ForwardBatch, kv_cache: torch.Tensor) -> torch.Tensor:
        """kv_cache: (num_layers, 2, num_slots, kv_heads, head_dim). Returns (num_sampled, vocab) fp32 logits."""
        x = self.embed_tokens(batch.input_ids)  # (num_tokens, hidden)
        cos_sin = self.rope(batch.positions, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos_sin, kv_cache[i], batch)
        x = self.norm(x[batch.logits_index])  # only rows whose next token is sampled
        return self.lm_head(x).float()
