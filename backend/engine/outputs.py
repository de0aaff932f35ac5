"""RequestOutput: what the engine emits per step per request (deltas, not totals), and how it is taken
from a request's sequences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.engine.request import Sequence


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's logprob and its top alternatives (token text, logprob)."""

    token_id: int
    token: str
    logprob: float
    top: tuple[tuple[int, str, float], ...] = ()  # (token_id, token text, logprob), best first


@dataclass(frozen=True)
class CompletionDelta:
    """New output of one choice (sibling index) since the previous delta."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: str | int | None = None  # the stop string or token id that ended it


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class RequestOutput:
    """One engine step's news for one request. `usage` is cumulative; `finished` is set once."""

    request_id: str
    deltas: tuple[CompletionDelta, ...]
    usage: Usage
    finished: bool = False
    prompt_token_ids: tuple[int, ...] | None = None  # only in the first output
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # only in the first output


def request_output(request_id: str, seqs: list[Sequence], finished: bool) -> RequestOutput:
    """What the request's sequences (n siblings) produced since the last output; the prompt goes out once."""
    deltas = tuple(take_delta(s) for s in seqs if s.pending_token_ids or (s.is_finished and not s.finish_reported))
    usage = Usage(
        prompt_tokens=seqs[0].num_prompt_tokens,
        completion_tokens=sum(s.num_output_tokens for s in seqs),
        cached_tokens=max(seqs[0].num_cached_tokens, 0),
    )
    first = seqs[0]
    if first.prompt_reported:
        return RequestOutput(request_id, deltas, usage, finished)
    first.prompt_reported = True
    prompt_lps = tuple(first.prompt_logprobs) if first.params.prompt_logprobs is not None else None
    return RequestOutput(request_id, deltas, usage, finished, tuple(first.token_ids[: first.num_prompt_tokens]), prompt_lps)


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


@dataclass(frozen=True)
class EngineStats:
    """A snapshot for /metrics and the dashboard."""

    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens_total: int
    generation_tokens_total: int
    num_preemptions: int
    extra: dict[str, float] = field(default_factory=dict)
