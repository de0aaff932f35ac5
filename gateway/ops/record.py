"""RequestRecord: what one request did, filled in as it runs; read by the access log and metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request

from backend.engine.outputs import Usage

if TYPE_CHECKING:  # names only: the record is filled by the layers above it
    from gateway.keys.config import KeyPolicy
    from gateway.ratelimit import Limit

SCOPE_KEY = "gateway.ops.record"


@dataclass
class RequestRecord:
    request_id: str
    method: str
    path: str
    start: float  # time.perf_counter() when the request arrived
    route: str = "unmatched"
    model: str = ""
    status: int = 0
    stream: bool = False
    user: str | None = None  # the client's end-user id (OpenAI's `user`), for abuse tracing
    key: str = "anonymous"  # which API key sent it, as its last 4 characters (the dashboard's per-key traffic)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    error_type: str | None = None
    deployment: str = ""  # the router's deployment that answered ("" without routing)
    cache: str = "none"  # response cache: none (off) | bypass (not cacheable) | miss | hit | semantic-hit
    policy: KeyPolicy | None = None  # the API key's KeyPolicy (gateway/keys/config.py), set by the middleware on /v1/ requests
    limit: Limit | None = None  # the key's rate Limit once the request was admitted (its tokens are spent when it ends)
    # what the key's budgets hold for it (gateway/spend/budget.py's Reservation, a layer above: the guard narrows it),
    # settled when it ends
    reservation: object | None = None
    cost: float = 0.0  # in the spend currency, once charged (gateway/spend/service.py)
    replayed: Usage | None = None  # a cache hit: the usage of the answer it replays
    batch: bool = False  # a batch line (gateway/batches/dispatch.py)

    def first_token(self) -> None:
        if self.ttft_s is None:
            self.ttft_s = time.perf_counter() - self.start

    def set_usage(self, usage: Usage) -> None:
        self.prompt_tokens = usage.prompt_tokens
        self.completion_tokens = usage.completion_tokens
        self.cached_tokens = usage.cached_tokens

    def client_disconnected(self) -> None:
        self.error_type = "client_disconnected"

    def finish(self) -> None:
        self.latency_s = time.perf_counter() - self.start


def record_of(request: Request) -> RequestRecord:
    """The record the gateway middleware attached to this request's scope."""
    record = request.scope.get(SCOPE_KEY)
    if not isinstance(record, RequestRecord):  # an app built without the middleware (never in production)
        record = RequestRecord("unknown", request.method, request.url.path, time.perf_counter())
        request.scope[SCOPE_KEY] = record
    return record
