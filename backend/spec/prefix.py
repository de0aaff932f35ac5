"""Logits processors at draft positions: row i sees the sequence as if draft[:i] were already emitted.

The plain sampler applies logit_bias -> min_tokens -> penalties -> grammar mask to one row per
sequence, conditioned on the tokens so far. A speculated step has 1 + k rows whose "tokens so far"
differ (each row has one more draft token), so each row gets a `PrefixView` of the sequence and the
grammar matcher is advanced through the draft and rolled back afterwards. The target's rows and the
draft model's rows go through the same processors, so both p and q are the distributions the plain
sampler would use, and greedy verification stays token-identical whatever the request asks for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from backend.engine.guided import apply_masks
from backend.engine.request import Sequence
from backend.engine.sampler import apply_logit_bias, apply_min_tokens, apply_penalties, apply_top_k_top_p_min_p
from backend.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class PrefixView:
    """What the logits processors read of a Sequence, for its real tokens followed by a draft prefix."""

    params: SamplingParams
    token_ids: list[int]
    num_prompt_tokens: int
    guide: Any

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


def needs_processing(seq: Sequence) -> bool:
    """False for the common case (no bias, min_tokens, penalties or grammar): rows go straight to sampling."""
    p = seq.params
    return bool(p.logit_bias) or p.min_tokens > 0 or p.uses_penalties or seq.guide is not None


def process_row(row: torch.Tensor, seq: Sequence, tokens: list[int], eos_token_id: int | None, *, masked: bool) -> None:
    """row: (1, vocab) logits after `tokens` (seq's real tokens + a draft prefix), processed in place.

    `masked`: seq.guide is at the state after `tokens`, so its mask applies (False once it stopped).
    """
    view = [PrefixView(seq.params, tokens, seq.num_prompt_tokens, seq.guide if masked else None)]
    apply_logit_bias(row, view)  # type: ignore[arg-type]
    apply_min_tokens(row, view, eos_token_id)  # type: ignore[arg-type]
    apply_penalties(row, view)  # type: ignore[arg-type]
    apply_masks(row, view)  # type: ignore[arg-type]


def process_target_rows(logits: torch.Tensor, seq: Sequence, base: list[int], draft: list[int], *, eos: int | None) -> None:
    """logits: (1 + len(draft), vocab); row i follows base + draft[:i]. In place.

    With a grammar, only the rows up to the first draft token it rejects are processed: that token
    has target probability 0 there, so verification stops at it and never reads a later row.
    """
    if not needs_processing(seq):
        return
    guide = seq.guide
    valid = len(draft) if guide is None else min(guide.validate_tokens(draft), len(draft))
    consumed = 0
    for i in range(valid + 1):
        process_row(logits[i : i + 1], seq, base + draft[:i], eos, masked=guide is not None and not guide.is_stopped())
        if guide is not None and i < valid and not guide.is_stopped():
            guide.consume_token(draft[i])
            consumed += 1
    if consumed:
        guide.rollback(consumed)


def target_probs(logits: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """(rows, vocab) processed logits -> the distributions the plain sampler draws from (temperature, top-k/p, min-p)."""
    probs = torch.softmax(logits / seq.params.temperature, dim=-1)
    return apply_top_k_top_p_min_p(probs, [seq] * logits.shape[0])
