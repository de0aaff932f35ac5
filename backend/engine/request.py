"""Sequence: one choice of one request, as the scheduler and the KV cache see it; and the RequestOutput taken
from a request's sequences after each step.

A request with n choices is n sequences with the same prompt ("siblings"); siblings after the
first wait until the first has computed the prompt, then share its KV blocks via the prefix cache.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backend.engine.outputs import CompletionDelta, RequestOutput, RequestTimings, TokenLogprob, Usage
from backend.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from backend.engine.block_pool import KVBlock
    from backend.engine.detokenizer import IncrementalDetokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    index: int  # choice index within the request
    token_ids: list[int]  # prompt followed by the output so far
    num_prompt_tokens: int
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    generator: torch.Generator | None = None  # per-request RNG when a seed is given
    first_sibling: Sequence | None = None  # siblings wait for it to compute the prompt
    arrival_time: float = field(default_factory=time.monotonic)
    # when it was first scheduled and got its first output token (time.monotonic()): the request's timings
    scheduled_time: float | None = None
    first_token_time: float | None = None
    num_preemptions: int = 0
    guide: Any = None  # llguidance.LLMatcher when the output is constrained (backend/engine/guided.py)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = -1  # prefix-cache hit tokens at first admission (-1: not yet admitted)
    block_table: list[KVBlock] = field(default_factory=list)
    window_table: list[KVBlock] = field(default_factory=list)  # the windowed layers' own pool, if any (kv_cache.py)
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    finish_reported: bool = False
    num_draft: int = 0  # unverified draft tokens at the end of token_ids
    num_draft_computed: int = 0  # leading tokens whose K/V are in the draft model's cache (backend/spec/draft_model.py)
    reference_ids: list[int] = field(default_factory=list)  # speculation source besides the sequence itself
    speculation: Any = None  # its adaptive speculation state (backend/spec/policy.py's SeqSpecState), once it decodes
    prompt_reported: bool = False
    # Not yet reported to the caller:
    pending_token_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def drop_draft(self) -> None:
        """Forget unverified draft tokens (e.g. when preempted: they must never be recomputed as real)."""
        if self.num_draft:
            del self.token_ids[len(self.token_ids) - self.num_draft :]
            self.num_draft = 0

    @property
    def ready_to_admit(self) -> bool:
        first = self.first_sibling
        return first is None or first.is_finished or first.num_computed_tokens >= first.num_prompt_tokens


def request_output(request_id: str, seqs: list[Sequence], finished: bool) -> RequestOutput:
    """What the request's sequences (n siblings) produced since the last output; the prompt goes out once."""
    deltas = tuple(take_delta(s) for s in seqs if s.pending_token_ids or (s.is_finished and not s.finish_reported))
    usage = Usage(
        prompt_tokens=seqs[0].num_prompt_tokens,
        completion_tokens=sum(s.num_output_tokens for s in seqs),
        cached_tokens=max(seqs[0].num_cached_tokens, 0),
    )
    first = seqs[0]
    timings = request_timings(seqs) if finished else None
    if first.prompt_reported:
        return RequestOutput(request_id, deltas, usage, finished, timings=timings)
    first.prompt_reported = True
    prompt_lps = tuple(first.prompt_logprobs) if first.params.prompt_logprobs is not None else None
    prompt = tuple(first.token_ids[: first.num_prompt_tokens])
    return RequestOutput(request_id, deltas, usage, finished, prompt, prompt_lps, timings)


def request_timings(seqs: list[Sequence]) -> RequestTimings:
    """When the request's first sequence arrived and was scheduled, its first token (of any choice), now."""
    scheduled = [s.scheduled_time for s in seqs if s.scheduled_time is not None]
    first_tokens = [s.first_token_time for s in seqs if s.first_token_time is not None]
    return RequestTimings(
        arrival=seqs[0].arrival_time,
        scheduled=min(scheduled) if scheduled else None,
        first_token=min(first_tokens) if first_tokens else None,
        finished=time.monotonic(),
        preemptions=sum(s.num_preemptions for s in seqs),
    )


def take_delta(seq: Sequence) -> CompletionDelta:
    """The sequence's pending tokens, text and logprobs as one delta; they are cleared from the sequence."""
    include = seq.stop_reason if seq.params.include_stop_str_in_output and isinstance(seq.stop_reason, str) else ""
    text = seq.detokenizer.take(seq.is_finished, include)
    logprobs = tuple(seq.pending_logprobs) if seq.params.logprobs is not None else None
    delta = CompletionDelta(seq.index, text, tuple(seq.pending_token_ids), logprobs, seq.finish_reason, seq.stop_reason)
    seq.pending_token_ids.clear()
    seq.pending_logprobs.clear()
    seq.finish_reported = seq.is_finished
    return delta
