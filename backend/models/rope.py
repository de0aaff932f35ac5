"""Rotary position embeddings, with every rope-scaling type transformers' configs describe."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _rope_parameters(config: PretrainedConfig) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return dict(params)


def inverse_frequencies(config: PretrainedConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,), attention_scaling). Scaled types reuse transformers' config math."""
    params = _rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (theta**exponents), 1.0
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(torch.nn.Module):
    """cos/sin tables for every position, applied "rotate_half" style (HF Llama layout)."""

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        with torch.device("cpu"):  # real tables even when the model is built on the meta device
            inv_freq, scaling = inverse_frequencies(config, head_dim)
            freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)  # (max_positions, head_dim)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for these positions, each (tokens, 1, head_dim): looked up once per forward."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rotary(
    q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: (tokens, heads, head_dim), k: (tokens, kv_heads, head_dim)."""
    cos, sin = cos_sin
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
