"""Rotary position embeddings, with every rope-scaling type transformers' configs describe."""

from __future__ import annotations

import mmap
from collections.abc import Callable

import numpy as np
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

    On a CPU the table is an anonymous memory map whose rows are computed as positions are first served (`cover`, which
    the model calls before each forward reads them): resident only as far as the longest context served so far, like
    the KV pool, not max_positions from the start (Gemma 3's two tables at 32k positions are 64 MB, a quarter of its
    Q4_K_M file). A row's values are the same whichever call computes it (elementwise ops on the same inputs). Moved
    or cast (`model.to`), the table is first computed whole.
    """

    CHUNK = 1024  # rows computed at a time (1 MB at head_dim 256)

    def __init__(self, config: PretrainedConfig, head_dim: int, max_positions: int, layer_type: str | None = None, *,
                 device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.max_positions, self.filled = max_positions, 0
        self._rows: np.ndarray | None = None  # the map's rows, written through numpy (no inference-mode tensor rules)
        with torch.device("cpu"):  # real tables even when the model is built on the meta device
            self.inv_freq, self.scaling = inverse_frequencies(config, head_dim, layer_type)
            if torch.device(device).type == "cpu":
                pages = mmap.mmap(-1, max_positions * head_dim * 4)  # zero pages until written; the tensor keeps it alive
                self._rows = np.frombuffer(pages, dtype=np.float32).reshape(max_positions, head_dim)
                table = torch.frombuffer(pages, dtype=torch.float32).view(max_positions, head_dim)
            else:
                table, self.filled = self.angles(0, max_positions).to(device), max_positions
        self.register_buffer("cos_sin", table, persistent=False)

    def angles(self, start: int, end: int) -> torch.Tensor:
        """(end - start, head_dim) fp32: the table's rows for positions start .. end - 1."""
        freqs = torch.outer(torch.arange(start, end, dtype=torch.float32, device="cpu"), self.inv_freq)
        return torch.cat((freqs.cos() * self.scaling, freqs.sin() * self.scaling), dim=-1)

    def cover(self, positions: int) -> None:
        """Make rows 0 .. positions - 1 hold their angles (whole chunks; a no-op once they do)."""
        if positions > self.filled and self._rows is not None:
            end = min(self.max_positions, -(-positions // self.CHUNK) * self.CHUNK)
            self._rows[self.filled : end] = self.angles(self.filled, end).numpy()
            self.filled = end

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RotaryEmbedding:
        """A move or a cast copies the table: every row first. (A no-op `.to` leaves it lazy.)"""
        if self._rows is not None and self.filled < self.max_positions and fn(self.cos_sin) is not self.cos_sin:
            self.cover(self.max_positions)
        out = super()._apply(fn, recurse)
        if self.cos_sin.data_ptr() != self._rows_ptr():
            self._rows = None  # a copy: whole, and what `cover` would write to is not the table any more
        return out

    def _rows_ptr(self) -> int:
        return -1 if self._rows is None else int(self._rows.ctypes.data)
