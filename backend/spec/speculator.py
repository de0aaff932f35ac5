"""Speculator: proposes drafts around the scheduler and verifies them after the step, inside continuous batching.

A draft is appended to the sequence's tokens as if it were real, so the scheduler and the model
runner need no special case: the sequence simply has 1 + k uncomputed tokens, which run as one
chunk (causal attention over the cache), and every position gets logits. After the step the
accepted prefix stays, the rest is cut off, and the KV of rejected positions is rolled back
(their slots are simply rewritten later; whole blocks past the end are freed).

    propose(running)   # before schedule(): n-gram drafts are copied in; draft-model drafts reserve k slots
    draft(out)         # after schedule(): the draft model fills the reserved slots the scheduler kept
    verify(seq, ...)   # after the target's forward: accepted tokens + one from the target

Three sources: n-gram lookup in the sequence itself or its reference text (method "ngram"; no model),
a draft model (method "draft", backend/spec/draft_model.py), and Medusa heads on the target's last hidden
state (method "medusa", backend/spec/medusa.py; `remember` keeps that state after each forward). With a
draft model or heads, requests that carry a reference text still copy from it: a near-miss cached answer
is a better guess than any model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from backend.config import EngineConfig
from backend.engine.kv_cache import KVCacheManager
from backend.engine.request import Sequence
from backend.engine.sampler import seeded_noise
from backend.engine.scheduler import ScheduledSeq, SchedulerOutput
from backend.spec.draft_model import DraftModel
from backend.spec.medusa import MedusaDrafter
from backend.spec.ngram import propose_ngram
from backend.spec.policy import DRAFT, HEADS, NGRAM, REFERENCE, SOURCES, AdaptivePolicy, SeqSpecState
from backend.spec.prefix import process_target_rows, target_probs
from backend.spec.verify import verify_greedy, verify_sampled, verify_seeded

# A draft model starts drafting for a sequence only if at most this many tokens per token it has left to generate
# must first go through the draft's cache (the prompt at the first step; a sequence that ran in a batch too big to
# speculate has its whole context to catch up when the batch shrinks). A token of catch-up costs ~1/20 of a target
# step, a drafted token saves ~1/4 (1 thread; bench/README "speculative", seventh session).
CATCH_UP_PER_TOKEN_LEFT = 4


@dataclass
class SourceCounts:
    proposed: int = 0  # draft tokens proposed
    accepted: int = 0  # ... of which accepted
    verifications: int = 0  # verified drafts (accepted + 1 tokens each)


@dataclass
class SpecStats(SourceCounts):
    by_source: dict[str, SourceCounts] = field(default_factory=lambda: {s: SourceCounts() for s in SOURCES})

    def add(self, source: str, proposed: int, accepted: int) -> None:
        for counts in (self, self.by_source[source]):
            counts.proposed += proposed
            counts.accepted += accepted
            counts.verifications += 1


def eligible(seq: Sequence) -> bool:
    return seq.params.speculate


def _grammar_prefix(seq: Sequence, draft: list[int]) -> list[int]:
    """The part of a copied/guessed draft that seq's grammar allows: it would reject the rest at once."""
    return draft[: seq.guide.validate_tokens(draft)] if seq.guide is not None and draft else draft


def _state(seq: Sequence) -> SeqSpecState:
    if seq.speculation is None:
        seq.speculation = SeqSpecState()
    state: SeqSpecState = seq.speculation  # Any on Sequence: backend/engine does not import backend/spec
    return state


class Speculator:
    def __init__(
        self, kv: KVCacheManager, config: EngineConfig, max_model_len: int, eos_token_id: int | None,
        *, draft_model: DraftModel | None = None, medusa: MedusaDrafter | None = None,
    ) -> None:
        """The draft length, batch limit and row cost come from the engine's config (num_speculative_tokens,
        speculative_max_batch, speculative_row_cost); the drafters are built by the engine."""
        self.kv = kv
        self.policy = AdaptivePolicy(config.num_speculative_tokens, config.speculative_row_cost, config.speculative_max_batch)
        self.max_model_len = max_model_len
        self.eos_token_id = eos_token_id
        self.draft_model = draft_model
        self.medusa = medusa
        self.stats = SpecStats()
        self._reserved: set[Sequence] = set()  # seqs whose draft tokens await the draft model
        self._q: dict[Sequence, torch.Tensor | None] = {}  # the draft model's distributions, until verified
        self._source: dict[Sequence, str] = {}  # where each pending draft came from

    @property
    def k(self) -> int:
        return self.policy.max_k

    def _sources(self, seq: Sequence) -> list[str]:
        """The sources seq can draft from, cheapest first. Forced drafts (row cost 0, no adaptation) come from the
        reference text or else the configured method only: with no row cost there is nothing to weigh sources by."""
        model = HEADS if self.medusa is not None else DRAFT if self.draft_model is not None else None
        have = {REFERENCE: bool(seq.reference_ids), NGRAM: model is None or self.policy.row_cost > 0,
                HEADS: model == HEADS, DRAFT: model == DRAFT}
        return [s for s in SOURCES if have[s]]

    def _room(self, seq: Sequence) -> int:
        """Draft tokens seq can still take: one token of max_tokens / the context is the target's own."""
        return min((seq.params.max_tokens or 0) - seq.num_output_tokens, self.max_model_len - seq.num_tokens) - 1

    def propose(self, running: list[Sequence]) -> None:
        """Give each decoding sequence the draft its policy chooses (n-gram copies now; the draft model reserves
        slots it fills after scheduling; Medusa heads guess for all their sequences in one call)."""
        self._reserved = {s for s in self._reserved if s.num_draft and not s.is_finished}  # dropped on preemption
        self._source = {s: src for s, src in self._source.items() if s.num_draft and not s.is_finished}
        if self.medusa is not None:
            self.medusa.forget_finished(running)
        if not self.policy.max_k or len(running) > self.policy.max_batch:
            return
        heads: list[tuple[Sequence, int]] = []  # seqs the Medusa heads draft for, in one batched call
        for seq in running:
            if seq.num_tokens - seq.num_computed_tokens != 1 or not eligible(seq) or (room := self._room(seq)) <= 0:
                continue
            state = _state(seq)
            for source, k in self.policy.plan(state, self._sources(seq), len(running)):
                k = min(k, room)
                if source == HEADS:
                    heads.append((seq, k))
                elif source == DRAFT:
                    if seq.num_tokens - seq.num_draft_computed > CATCH_UP_PER_TOKEN_LEFT * room:
                        continue  # its draft cache lags too far behind (it ran in a big batch): catching up costs more
                    self._reserved.add(seq)
                    self._add_draft(seq, [seq.token_ids[-1]] * k, source)  # k slots; the draft model fills them
                elif not self._add_draft(seq, self._lookup(seq, source, k), source):
                    continue  # no match: the next source
                self._source[seq] = source
                self.policy.proposed(state)
                break
        if heads:
            drafts = self.medusa.propose(heads)  # type: ignore[union-attr]
            for seq, _ in heads:
                self._add_draft(seq, drafts.get(seq, []), HEADS)

    @staticmethod
    def _lookup(seq: Sequence, source: str, k: int) -> list[int]:
        reference = seq.reference_ids if source == REFERENCE else ()
        return propose_ngram(seq.token_ids, k, reference, search_self=source == NGRAM)

    def _add_draft(self, seq: Sequence, draft: list[int], source: str) -> bool:
        draft = draft if source == DRAFT else _grammar_prefix(seq, draft)
        seq.token_ids.extend(draft)
        seq.num_draft = len(draft)
        return bool(draft)

    def draft(self, out: SchedulerOutput, generator: torch.Generator) -> None:
        """Let the draft model fill the reserved drafts that were scheduled (verified whole this step)."""
        seqs = [c.seq for c in out.scheduled if c.seq in self._reserved and c.seq.num_draft]
        if not seqs:
            return
        assert self.draft_model is not None
        self._q.update(self.draft_model.propose(seqs, generator))
        self._reserved.difference_update(seqs)
        # an unsure draft proposed fewer tokens: its chunk shrinks (the spare slots stay allocated)
        out.decodes[:] = [ScheduledSeq(c.seq, 1 + c.seq.num_draft) if c.seq in self._q else c for c in out.decodes]

    def remember(self, seq: Sequence, hidden: torch.Tensor, num_tokens: int | None = None) -> None:
        """hidden: the final hidden state whose logits produced seq's newest token, the one that makes it
        `num_tokens` long (default: now). Medusa drafts from it at the next step."""
        if self.medusa is not None and eligible(seq):
            self.medusa.remember(seq, hidden, seq.num_tokens if num_tokens is None else num_tokens)

    def verify(
        self, seq: Sequence, logits: torch.Tensor, generator: torch.Generator, hidden: torch.Tensor | None = None
    ) -> list[int]:
        """logits: (1 + k, vocab) for the last real token and each draft token. Returns the tokens to emit.

        Leaves seq holding only real tokens, with num_computed_tokens covering the accepted ones.
        hidden: (1 + k, hidden) the rows' final hidden states, for Medusa: the bonus token's row is remembered.
        """
        draft = seq.token_ids[len(seq.token_ids) - seq.num_draft :]
        base = seq.num_tokens - seq.num_draft
        del seq.token_ids[base:]
        seq.num_draft = 0
        q = self._q.pop(seq, None)
        process_target_rows(logits, seq, seq.token_ids, draft, eos=self.eos_token_id)
        if seq.params.greedy:
            accepted, bonus = verify_greedy(logits, draft)
        elif seq.generator is not None:  # row i draws the token at position base + i
            noise = torch.stack([seeded_noise(seq, base + i, logits.shape[1], logits.device) for i in range(len(draft) + 1)])
            accepted, bonus = verify_seeded(target_probs(logits, seq), draft, noise)
        else:
            accepted, bonus = verify_sampled(target_probs(logits, seq), draft, q, seq.generator or generator)
        seq.num_computed_tokens = base + accepted  # KV of the last real token and the accepted drafts is valid
        seq.num_draft_computed = min(seq.num_draft_computed, seq.num_computed_tokens)
        self.kv.trim(seq)
        if hidden is not None:
            self.remember(seq, hidden[accepted], base + accepted + 1)  # after the engine appends the tokens
        source = self._source.pop(seq, NGRAM)
        self.stats.add(source, len(draft), accepted)
        self.policy.verified(_state(seq), source, len(draft), accepted)
        return [*draft[:accepted], bonus]
