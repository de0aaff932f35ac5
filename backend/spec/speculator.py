"""Speculator: proposes drafts before a step and verifies them after it, inside continuous batching.

A draft is appended to the sequence's tokens as if it were real, so the scheduler and the model
runner need no special case: the sequence simply has 1 + k uncomputed tokens, which run as one
chunk (causal attention over the cache), and every position gets logits. After the step the
accepted prefix stays, the rest is cut off, and the KV of rejected positions is rolled back
(their slots are simply rewritten later; whole blocks past the end are freed).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.kv_cache import KVCacheManager
from backend.request import Sequence
from backend.sampler import apply_logit_bias, apply_top_k_top_p_min_p
from backend.spec.ngram import propose_ngram
from backend.spec.verify import verify_greedy, verify_sampled


@dataclass
class SpecStats:
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # ... of which accepted
    verifications: int = 0  # verified drafts (accepted + 1 tokens each)


def eligible(seq: Sequence) -> bool:
    """Position-dependent processors (penalties, min_tokens, grammars) are not speculated through yet."""
    p = seq.params
    return p.speculate and not p.uses_penalties and seq.guide is None and seq.num_output_tokens >= p.min_tokens


class Speculator:
    def __init__(self, kv: KVCacheManager, num_tokens: int, max_batch: int, max_model_len: int) -> None:
        self.kv = kv
        self.k = num_tokens
        self.max_batch = max_batch  # beyond this many running sequences, verification costs more than it saves
        self.max_model_len = max_model_len
        self.stats = SpecStats()

    def propose(self, running: list[Sequence]) -> None:
        if not self.k or len(running) > self.max_batch:
            return
        for seq in running:
            if seq.num_tokens - seq.num_computed_tokens == 1 and eligible(seq):
                room = min((seq.params.max_tokens or 0) - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1
                draft = propose_ngram(seq.token_ids, min(self.k, room), seq.reference_ids) if room > 0 else []
                seq.token_ids.extend(draft)
                seq.num_draft = len(draft)

    def verify(self, seq: Sequence, logits: torch.Tensor, generator: torch.Generator) -> list[int]:
        """logits: (1 + k, vocab) for the last real token and each draft token. Returns the tokens to emit.

        Leaves seq holding only real tokens, with num_computed_tokens covering the accepted ones.
        """
        draft = seq.token_ids[len(seq.token_ids) - seq.num_draft :]
        base = seq.num_tokens - seq.num_draft
        del seq.token_ids[base:]
        seq.num_draft = 0
        rows = [seq] * logits.shape[0]
        apply_logit_bias(logits, rows)
        if seq.params.greedy:
            accepted, bonus = verify_greedy(logits, draft)
        else:
            probs = torch.softmax(logits / seq.params.temperature, dim=-1)
            accepted, bonus = verify_sampled(apply_top_k_top_p_min_p(probs, rows), draft, seq.generator or generator)
        seq.num_computed_tokens = base + accepted  # KV of the last real token and the accepted drafts is valid
        self.kv.trim(seq)
        self.stats.proposed += len(draft)
        self.stats.accepted += accepted
        self.stats.verifications += 1
        return [*draft[:accepted], bonus]
