"""The adaptive speculation policy: per sequence and per step, which source proposes and how many tokens (k).

A verified draft of k tokens costs k more rows in the step; it saves the plain steps its accepted tokens would have
taken. Each source's acceptance is tracked per sequence as the probability `alpha` that a draft token is accepted
given that the ones before it were (an exponentially weighted count of accepted tokens over tokens tried: the
accepted ones plus the first rejected one). Token i of a draft is then accepted with probability alpha**i, and it
is worth verifying when that pays for its row:

    alpha**i * token_cost(B) > row_cost + proposal cost     token_cost(B) = ((1 - row_cost) + row_cost * B) / B

in units of a one-sequence decode step: `row_cost` is what one more row adds to it, and token_cost(B) what a token
costs in a plain decode step of B sequences. As the batch grows a token costs little more than its row, so only
near-certain drafts still pay: the crossover follows from the measured row cost (bench/speculative.py's sweep).

Sources, cheapest first: the reference text (a near-miss cached answer), the sequence's own prompt and output
(n-gram lookup), Medusa heads, the draft model. A sequence proposes from the first source whose k is positive and
which has a proposal. When none qualifies it stops speculating, and probes again with one token after
`PROBE_AFTER` steps, doubling the wait after each probe that is rejected (a chat that never repeats costs ~log(n)
rejected rows over n tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

REFERENCE, NGRAM, HEADS, DRAFT = "reference", "ngram", "medusa", "draft"
SOURCES = (REFERENCE, NGRAM, HEADS, DRAFT)  # cheapest first
# First guesses of alpha, just above what pays at one sequence (a new sequence tries its sources with short drafts
# and lengthens them as they are accepted; two verifications outweigh the guess): a near-miss answer is mostly right.
PRIOR = {REFERENCE: 0.9, NGRAM: 0.5, HEADS: 0.5, DRAFT: 0.5}
PRIOR_WEIGHT = 2.0  # tokens tried the prior counts for
DECAY = 0.8  # weight of the past per verification: recent drafts count most (a RAG answer starts and stops copying)
# Proposal cost per drafted token, in one-sequence decode steps: n-gram lookups are Python list scans; Medusa heads
# one small batched call per step; the draft model a forward of its own per token (~1/20 of the target's at
# full precision, bench/README "speculative").
PROPOSAL_COST = {REFERENCE: 0.0, NGRAM: 0.0, HEADS: 0.02, DRAFT: 0.05}
PROBE_AFTER = 8  # steps without speculating before a sequence probes again (doubles after each rejected probe)


@dataclass
class SourceEstimate:
    accepted: float
    tried: float

    @property
    def alpha(self) -> float:
        return self.accepted / self.tried if self.tried else 0.0

    def update(self, accepted: int, tried: int) -> None:
        self.accepted = DECAY * self.accepted + accepted
        self.tried = DECAY * self.tried + tried


@dataclass
class SeqSpecState:
    """A sequence's acceptance per source and its probing schedule."""

    estimates: dict[str, SourceEstimate] = field(
        default_factory=lambda: {s: SourceEstimate(PRIOR[s] * PRIOR_WEIGHT, PRIOR_WEIGHT) for s in SOURCES}
    )
    idle_steps: int = 0  # decode steps since it last speculated
    probe_after: int = PROBE_AFTER
    probing: bool = False  # the pending draft is a probe


def token_cost(row_cost: float, batch: int) -> float:
    """A token's share of a plain decode step of `batch` sequences, in one-sequence decode steps."""
    return ((1.0 - row_cost) + row_cost * batch) / batch


def best_k(alpha: float, max_k: int, row_cost: float, batch: int, *, proposal_cost: float = 0.0) -> int:
    """The longest draft whose every token is expected to pay for its row (and its proposal). row_cost 0: max_k
    always (every sequence drafts its longest draft at any batch size, as before the policy adapted)."""
    if row_cost <= 0:
        return max_k
    threshold = (row_cost + proposal_cost) / token_cost(row_cost, batch)
    k, p = 0, alpha
    while k < max_k and p > threshold:
        k, p = k + 1, p * alpha
    return k


@dataclass
class AdaptivePolicy:
    max_k: int  # num_speculative_tokens: the longest draft
    row_cost: float  # speculative_row_cost
    max_batch: int  # speculative_max_batch: never speculate with more running sequences

    def plan(self, state: SeqSpecState, sources: list[str], batch: int) -> list[tuple[str, int]]:
        """(source, k) to try in order for this step, cheapest first; [] when the sequence does not speculate."""
        if batch > self.max_batch or not self.max_k:
            return []
        plan = [(s, k) for s in sources
                if (k := best_k(state.estimates[s].alpha, self.max_k, self.row_cost, batch, proposal_cost=PROPOSAL_COST[s])) > 0]
        state.probing = not plan
        if plan:
            return plan
        state.idle_steps += 1
        if state.idle_steps < state.probe_after:
            return []
        return [(s, 1) for s in sources]  # a probe: one token from the cheapest source that has one

    def proposed(self, state: SeqSpecState) -> None:
        state.idle_steps = 0

    def verified(self, state: SeqSpecState, source: str, proposed: int, accepted: int) -> None:
        state.estimates[source].update(accepted, accepted + (accepted < proposed))
        if state.probing:  # a rejected probe waits twice as long for the next; an accepted one resets the wait
            state.probe_after = PROBE_AFTER if accepted else 2 * state.probe_after
            state.probing = False
