"""RequestOutput: what the engine emits per step per request (deltas, not totals). Plain frozen types, no engine
state: the gateway imports them (backend/engine/request.py builds them from a request's sequences)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
class RequestTimings:
    """Where a finished request's time went, as time.monotonic() readings of the engine's process: it arrived
    (was added to the engine), was first scheduled, produced its first token, finished; None: never got that far.
    Queue wait is arrival..scheduled, prefill scheduled..first_token, decode first_token..finished."""

    arrival: float
    scheduled: float | None
    first_token: float | None
    finished: float
    preemptions: int = 0  # times it lost its KV blocks and went back to waiting


@dataclass(frozen=True)
class RequestOutput:
    """One engine step's news for one request. `usage` is cumulative; `finished` is set once."""

    request_id: str
    deltas: tuple[CompletionDelta, ...]
    usage: Usage
    finished: bool = False
    prompt_token_ids: tuple[int, ...] | None = None  # only in the first output
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None  # only in the first output
    timings: RequestTimings | None = None  # only in the finished output


@dataclass(frozen=True)
class SpecSourceStats:
    """Speculative draft tokens one source (reference, ngram, medusa, draft) proposed, and how many were accepted."""

    proposed: int
    accepted: int


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
    spec_sources: dict[str, SpecSourceStats] = field(default_factory=dict)  # per speculation source
