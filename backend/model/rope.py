"""Rotary position embeddings, with every rope-scaling type transformers' configs describe."""

from __future__ import annotations

from collections.abc import Callable

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
    """A (positions, head_dim) fp32 table: cos in the first half, sin in the second (rotate-half layout).

    The table stays fp32 whatever the model dtype (the loader moves it without casting), as the
    reference model computes its angles in fp32.

    On a CPU the table holds only the rows served so far: the model calls `cover` before a forward reads positions past
    its end, and the table grows (at least doubling, in whole chunks), so it is resident only as far as the longest
    context served, like the KV pool. Gemma 3's two tables at 32k positions would be 64 MB from the start, a quarter of
    its Q4_K_M file. A row's values are the same whichever call computes it (elementwise ops on the same inputs). On a
    GPU the table is whole from the start: a CUDA graph holds its address. A move or a cast computes every row first.
    """

    CHUNK = 1024  # rows are added in whole chunks (1 MB at head_dim 256)

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int, layer_type: str | None = None, *,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.max_positions = max_positions
        with torch.device("cpu"):  # real angles even when the model is built on the meta device
            self.inv_freq, self.scaling = inverse_frequencies(config, head_dim, layer_type)
        rows = 0 if torch.device(device).type == "cpu" else max_positions
        self.register_buffer("cos_sin", self.angles(0, rows).to(device), persistent=False)

    @property
    def filled(self) -> int:
        return self.cos_sin.shape[0]

    def angles(self, start: int, end: int) -> torch.Tensor:
        """(end - start, head_dim) fp32: the table's rows for positions start .. end - 1."""
        freqs = torch.outer(torch.arange(start, end, dtype=torch.float32, device="cpu"), self.inv_freq)
        return torch.cat((freqs.cos() * self.scaling, freqs.sin() * self.scaling), dim=-1)

    def cover(self, positions: int) -> None:
        """Make the table hold rows 0 .. positions - 1 (a no-op once it does)."""
        if positions > self.filled:
            end = min(self.max_positions, max(2 * self.filled, -(-positions // self.CHUNK) * self.CHUNK))
            self.cos_sin = torch.cat((self.cos_sin, self.angles(self.filled, end).to(self.cos_sin)))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RotaryEmbedding:
        """A move or a cast copies the table: every row first. (A no-op `.to` leaves it as it is.)"""
        if self.filled < self.max_positions and fn(self.cos_sin) is not self.cos_sin:
            self.cover(self.max_positions)
        return super()._apply(fn, recurse)
