"""Rotary position embeddings, with every rope-scaling type transformers' configs describe."""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def _rope_parameters(config: PretrainedConfig, layer_type: str | None = None) -> dict:
    """The rope parameters (of one layer type, where the config has one set per type: Gemma 3)."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        return dict(params[layer_type])
    return dict(params)


def inverse_frequencies(config: PretrainedConfig, head_dim: int, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq (head_dim/2,), attention_scaling). Scaled types reuse transformers' config math."""
    params = _rope_parameters(config, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (theta**exponents), 1.0
    init = ROPE_INIT_FUNCTIONS[rope_type]
    inv_freq, scaling = init(config, "cpu", layer_type=layer_type) if layer_type else init(config, "cpu")
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(torch.nn.Module):
    """A (max_positions, head_dim) fp32 table: cos in the first half, sin in the second (rotate-half layout).

    The table stays fp32 whatever the model dtype (the loader moves it without casting), as the
    reference model computes its angles in fp32.
    """

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int, layer_type: str | None = None) -> None:
        super().__init__()
        with torch.device("cpu"):  # real tables even when the model is built on the meta device
            inv_freq, scaling = inverse_frequencies(config, head_dim, layer_type)
            freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (max_positions, d/2)
            table = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
        self.register_buffer("cos_sin", table, persistent=False)
