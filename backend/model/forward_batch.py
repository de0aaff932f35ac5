"""ForwardBatch: everything one model forward needs, packed; passed as an argument, never global.

Token order in the packed batch: all decode tokens first (one per sequence), then the prefill
chunks one sequence after another. Attention runs once for the decode group and once for the
prefill group, both batched (padded), so no Python loop runs per sequence inside the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

# Each decoder layer's KV cache, indexed by the model's layer index: one tensor over all layers (num_layers, 2,
# num_slots, kv_heads, head_dim), or a list of per-layer tensors where the layers' pools differ in size (windowed
# layers in a pool of their own).
LayerCaches = torch.Tensor | Sequence[torch.Tensor]


@dataclass(frozen=True)
class DecodeMetadata:
    """One query token per sequence against its whole context."""

    context_blocks: torch.Tensor  # (num_decodes, ctx_blocks) long: blocks of the context, padded with block 0
    mask: torch.Tensor  # (num_decodes, 1, 1, ctx_blocks * block_size) float: 0 for valid keys, -inf for padding
    block_tables: torch.Tensor  # (num_decodes, max_blocks) int32, for paged kernels
    context_lens: torch.Tensor  # (num_decodes,) int32
    window_mask: torch.Tensor | None = None  # like mask, also -inf outside the sliding window (windowed models)
    max_context_len: int = 0  # max(context_lens), known on the host (0: unknown, read from the tensor)


@dataclass(frozen=True)
class PrefillMetadata:
    """Chunks of new tokens per sequence, attending causally to earlier context in the cache."""

    query_index: torch.Tensor  # (num_prefills, max_query) long: packed row of each padded query
    query_valid: torch.Tensor  # (num_prefills, max_query) bool
    context_blocks: torch.Tensor  # (num_prefills, ctx_blocks) long: blocks of the context, padded with block 0
    mask: torch.Tensor  # (num_prefills, 1, max_query, max_context) bool: True = may attend
    block_tables: torch.Tensor  # (num_prefills, max_blocks) int32
    context_lens: torch.Tensor  # (num_prefills,) int32, computed + new tokens
    cu_seqlens_q: torch.Tensor  # (num_prefills + 1,) int32
    window_mask: torch.Tensor | None = None  # like mask, also False outside the sliding window (windowed models)
    # Each query token attends as a decode query over its causal prefix (or window), through the C paged decode
    # kernel's tiled prefill entry: where the runner attends every chunk so (per_token_prefill), or every chunk is
    # short (a speculative verify, a draft model's catch-up). False: the padded SDPA path.
    per_token: bool = False
    max_context_len: int = 0  # max(context_lens)


@dataclass(frozen=True)
class ForwardBatch:
    input_ids: torch.Tensor  # (num_tokens,) long
    positions: torch.Tensor  # (num_tokens,) long
    slot_mapping: torch.Tensor  # (num_tokens,) long: where each new token's K/V is stored
    num_decode_tokens: int
    decode: DecodeMetadata | None
    prefill: PrefillMetadata | None
    logits_index: torch.Tensor  # (num_sampled,) long: rows whose next token is sampled
    block_size: int  # tokens per KV block (the metadata's block ids are in these units)
    window: int = 0  # the sliding window the masks implement (0: full attention); see with_window
    # The batch as the windowed layers see it when their K/V live in a pool of their own (backend/engine/kv_cache.py):
    # its slots, block tables and window masks index that pool
    windowed: ForwardBatch | None = None

    def with_window(self, window: int) -> ForwardBatch:
        """The batch as a layer with this sliding window (0: full) sees it: the windowed layers' own view, or the
        window masks swapped in (torch path) and `window` set (the Triton kernels take it as an argument). The model
        runner built both."""
        if window == self.window:
            return self
        if self.windowed is not None:
            return self.windowed
        decode, prefill = self.decode, self.prefill
        if decode is not None:
            decode = replace(decode, mask=decode.window_mask, window_mask=decode.mask)
        if prefill is not None:
            prefill = replace(prefill, mask=prefill.window_mask, window_mask=prefill.mask)
        return replace(self, decode=decode, prefill=prefill, window=window)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    def positions_end(self) -> int:
        """One past the highest position in the batch: from the metadata's host-side context lengths where they say it
        (a token's position is below its context length), else read from the positions (a device sync on a GPU)."""
        known = [m.max_context_len for m in (self.decode, self.prefill) if m is not None]
        if known and all(known):
            return max(known)
        return int(self.positions.max()) + 1 if self.num_tokens else 0
