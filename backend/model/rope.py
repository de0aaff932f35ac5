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
    """A (max_positions, head_dim) fp32 table: cos in the first half, sin in the second (rotate-half layout).

    The table stays fp32 whatever the model dtype (the loader moves it without casting), as the
    reference model computes its angles in fp32.
    """

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int) -> None:
        super().__init__()
        with torch.device("cpu"):  # real tables even when the model is built on the meta device
            inv_freq, scaling = inverse_frequencies(config, head_dim)
            freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (max_positions, d/2)
            table = torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)
        self.register_buffer("cos_sin", table, persistent=False)
