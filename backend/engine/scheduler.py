"""Iteration-level scheduler with chunked prefill, prefix caching and preemption.

Every step has a token budget. Running sequences go first, most urgent first (a decode costs one
token, an unfinished prefill takes what is left of the budget), then waiting sequences are
admitted in priority order while budget, sequence slots and KV blocks last. When a running
sequence cannot get a block, the least urgent one (lowest priority, then latest arrival) is
preempted: its blocks are freed and it recomputes later (its full blocks usually survive in the
prefix cache). "Urgent" is backend/engine/priority.py's key: vLLM's `priority` (lower first) with ageing;
with every priority equal it is plain arrival order.

Background work (priority BACKGROUND_PRIORITY, the lowest the field allows: the gateway's batch lines) gets
steps of at most `background_max_tokens` while nothing else is queued or running: a step cannot be interrupted,
so a live request arriving during one waits for it, and a small step keeps that wait short.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from backend.config import EngineConfig
from backend.engine.kv_cache import KVCacheManager
from backend.engine.priority import priority_key
from backend.engine.request import Sequence, SequenceStatus
from backend.errors import QueueFullError

BACKGROUND_PRIORITY = 2**31 - 1  # the lowest priority SamplingParams allows


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence, so a next token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        seq = self.seq
        return seq.params.prompt_logprobs is not None and seq.index == 0 and seq.num_computed_tokens < seq.num_prompt_tokens

    @property
    def num_logit_rows(self) -> int:
        """Rows the LM head computes: all for prompt logprobs or a draft to verify, else the last if it samples."""
        return self.num_new_tokens if self.wants_prompt_logprobs or self.seq.num_draft else int(self.samples)


def is_decode(seq: Sequence, n: int) -> bool:
    """A chunk of n tokens is a decode: the sequence's last token, plus its draft to verify when it speculates
    (each draft position then attends as the plain decode step there would, in the decode group)."""
    return n == seq.num_tokens - seq.num_computed_tokens == 1 + seq.num_draft


@dataclass(frozen=True)
class SchedulerOutput:
    """What one step runs: decodes (one token each, or 1 + k for a draft to verify) first, then prefill chunks."""

    decodes: list[ScheduledSeq] = field(default_factory=list)
    prefills: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        return self.decodes + self.prefills

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, config: EngineConfig) -> None:
        """The batch limits come from the engine's config, read here once."""
        self.kv = kv
        self.priority_aging_s = config.priority_aging_s
        self.background_max_tokens = config.background_max_batched_tokens  # 0: background steps get the full budget
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.max_waiting = config.max_waiting
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seqs: list[Sequence]) -> None:
        if len(self.waiting) + len(seqs) > self.max_waiting:
            raise QueueFullError(f"the engine queue is full ({self.max_waiting} waiting)")
        self.waiting.extend(seqs)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        now = time.monotonic()
        self.running.sort(key=lambda seq: priority_key(seq, now, self.priority_aging_s))  # stable: ties keep order
        budget = self._schedule_running(out, self._budget())
        if not out.preempted:  # admitting new work right after preempting would just thrash
            self._schedule_waiting(out, budget, now)
        return out

    def _budget(self) -> int:
        """The step's token budget: smaller while only background sequences are here (never below one decode
        each, so a step still advances every running sequence)."""
        if not self.background_max_tokens or any(
            seq.params.priority < BACKGROUND_PRIORITY for seq in (*self.running, *self.waiting)
        ):
            return self.max_num_batched_tokens
        return min(self.max_num_batched_tokens, max(self.background_max_tokens, len(self.running)))

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        for seq in list(self.running):
            if budget == 0 or seq not in self.running:
                continue
            if seq.num_draft and seq.num_tokens - seq.num_computed_tokens > budget:
                seq.drop_draft()  # a draft is verified whole or not at all
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not self.kv.allocate_slots(seq, n):
                victim = self.running[-1]  # the least urgent
                self._preempt(victim, out)
                if victim is seq:
                    break
            else:
                (out.decodes if is_decode(seq, n) else out.prefills).append(ScheduledSeq(seq, n))
                budget -= n
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, now: float) -> None:
        for seq in sorted(self.waiting, key=lambda seq: priority_key(seq, now, self.priority_aging_s)):
            if budget == 0 or len(self.running) >= self.max_num_seqs:
                return
            if not seq.ready_to_admit:
                continue  # a sibling waits for its first sibling's prompt KV
            cached = self.kv.find_cached_prefix(seq)
            hit = cached.num_blocks * self.kv.block_size
            n = min(seq.num_tokens - seq.num_computed_tokens - hit, budget)
            if not self.kv.allocate_slots(seq, n, cached):
                return  # in order: don't let less urgent (smaller) requests jump the queue
            if seq.num_cached_tokens < 0:  # its first admission
                seq.num_cached_tokens = hit
                seq.scheduled_time = now
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.prefills.append(ScheduledSeq(seq, n))
            budget -= n

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        seq.drop_draft()
        self.running.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        seq.num_preemptions += 1
        self.num_preemptions += 1

    def finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        """Mark seq finished and free its blocks at once (also used for aborts)."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason, seq.stop_reason = SequenceStatus.FINISHED, reason, stop_reason
        self.kv.free(seq)
