"""Sliding-window attention (Mistral; per-layer windows as in Qwen2 / newer configs' `layer_types`).

A windowed layer's query at position p sees the keys at positions p - W < k <= p (HF's rule). Which layers:

- config.layer_types (newer transformers fill it for Qwen2 and others): "sliding_attention" layers use
  config.sliding_window, every other type attends fully;
- otherwise config.sliding_window (Mistral): every layer.

KV blocks: a block whose positions all lie at or before p - W for the next query p is never read again by a windowed
layer, so the KV cache frees it early (KVCacheManager.free_out_of_window): the block itself once every layer is
windowed; with full and windowed layers mixed, the windowed layers' copy, which they keep in a pool of their own.
"""

from __future__ import annotations

from transformers import PretrainedConfig


def layer_windows(config: PretrainedConfig) -> list[int]:
    """Each layer's window in tokens; 0 = full attention."""
    window = int(getattr(config, "sliding_window", None) or 0)
    n = config.num_hidden_layers
    if not window:
        return [0] * n
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else 0 for t in types]
    return [window] * n


def freeable_window(config: PretrainedConfig) -> int:
    """The window after which KV blocks may be freed: the window when every layer has one (all equal), else 0."""
    windows = set(layer_windows(config))
    return windows.pop() if len(windows) == 1 else 0


def blocks_out_of_window(num_computed_tokens: int, window: int, block_size: int) -> int:
    """How many leading blocks no later query can see: the next query sits at position num_computed_tokens and
    sees keys >= num_computed_tokens - window + 1, so block b goes when (b + 1) * block_size <= that bound."""
    if window <= 0:
        return 0
    return max(num_computed_tokens - window + 1, 0) // block_size
