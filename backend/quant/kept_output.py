"""An LM head's output tensor, kept from call to call.

At a large vocabulary one decode step's logits pass glibc's largest mmap threshold (32 MB: 32 rows of Gemma 3's
262,144 tokens are 33.5 MB, 56 rows of Qwen's 151,936), so a new tensor each step was mapped, faulted in page by page
and unmapped again: 4-5 ms of a 42 ms Gemma 3 step at 32 streams (one engine decoded 723 tok/s that way, 932 with the
kept tensor). The engine reads a step's logits before its next forward, so one tensor serves. A call of more than
MAX_ROWS rows (prompt log-probabilities over a prefill chunk) gets a tensor of its own, so the kept one stays the size
of a decode step. The loader gives the LM head one (`keep_head_output`); the C kernels' heads write into it.
"""

from __future__ import annotations

import torch
from torch import nn


class KeptOutput:
    MAX_ROWS = 64

    def __init__(self) -> None:
        self._tensor: torch.Tensor | None = None

    def rows(self, m: int, n: int) -> torch.Tensor | None:
        """(m, n) float32 rows of the kept tensor (made anew where it is smaller or narrower), or None: a tensor of its
        own for this call."""
        if m > self.MAX_ROWS:
            return None
        if self._tensor is None or self._tensor.shape[0] < m or self._tensor.shape[1] != n:
            self._tensor = torch.empty(m, n)
        return self._tensor[:m]


def keep_head_output(model: nn.Module) -> None:
    """Give the model's LM head a kept output where it takes one: a head whose kernel writes into it declares a
    `kept_output` attribute (GgufLinear, LowBitHead)."""
    head = getattr(model, "lm_head", None)
    if head is not None and hasattr(head, "kept_output"):
        head.kept_output = KeptOutput()
