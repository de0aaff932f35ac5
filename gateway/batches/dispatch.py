"""Sending one batch line through the gateway's own handler for its endpoint, as if a client had: the same
key checks, allow-lists, rate limits, response cache and routing. Only the middleware is skipped, so batch
lines are not counted as live traffic (not in /v1/stats, not against `max_concurrent_requests`); what the
middleware does besides, charging the line's tokens to its key's tpm, is done here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message

from gateway.errors import error_body, to_gateway_error
from gateway.keys.config import KeyPolicy
from gateway.ops.record import SCOPE_KEY, RequestRecord

Handler = Callable[[Request], Awaitable[Response]]
Spend = Callable[[RequestRecord], Awaitable[None]]  # KeyGuard.spend: a finished request's tokens to its key's tpm


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


async def call(
    handler: Handler,
    path: str,
    body: dict[str, Any],
    authorization: str | None,
    *,
    policy: KeyPolicy | None,
    request_id: str,
    spend: Spend | None = None,
) -> Reply:
    """`policy`: the batch owner's key policy, as the middleware would have set it (models, caps, rate limits).
    Without `authorization` (a key configured only by its hash) the line bypasses the cache: no namespace to use."""
    data = orjson.dumps(body)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if authorization:
        headers.append((b"authorization", authorization.encode()))
    elif policy is not None:
        headers.append((b"x-smolgate-cache", b"no-lookup, no-store"))
    rec = RequestRecord(request_id, "POST", path, time.perf_counter(), route=path, key=policy.name if policy else "batch")
    rec.policy = policy
    rec.batch = True
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"", "headers": headers,
        "client": ("127.0.0.1", 0), "server": ("batch", 0), SCOPE_KEY: rec,
    }  # fmt: skip
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await asyncio.Event().wait()  # never disconnects; the runner cancels the task to abort a line
        raise AssertionError("unreachable")

    status, out_headers, chunks = 500, {}, []

    async def send(message: Message) -> None:
        nonlocal status, out_headers
        if message["type"] == "http.response.start":
            status = message["status"]
            out_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in message.get("headers", ())}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)
    except Exception as exc:  # what the middleware would have sent
        err = to_gateway_error(exc)
        return Reply(err.status, error_body(err), err.headers())
    finally:
        if spend is not None:  # also for a line aborted part way: the tokens it did use count
            await spend(rec)
    raw = b"".join(chunks)
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = raw.decode("utf-8", "replace")
    return Reply(status, parsed, out_headers)
