"""One attempt on an OpenAI-compatible upstream: a JSON answer, or an SSE stream passed through.

Streams are primed (the first event read) before the response starts, so an upstream that fails or
stalls before its first token is retried elsewhere; after that, a break becomes one clear error event.
Usage is always counted: asked of the upstream (stream_options.include_usage), else estimated.
A finished answer may be handed to `keep` (the router's response cache): the JSON body, or a plain-text stream put
back together as the body it stands for.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import Response

from backend.engine.outputs import Usage
from gateway.errors import GatewayError
from gateway.ops.record import RequestRecord
from gateway.ops.sent import sent
from gateway.protocol.events import ChatEvent, Opened, Step, UsageReport, chunk_events
from gateway.protocol.jsonio import json_response
from gateway.protocol.sse import ChatStream, StreamLimits
from gateway.routing.token_count import completion_text, delta_text, usage_of
from gateway.routing.upstream import Upstream, UpstreamError


class UpstreamFailed(GatewayError):
    """A stream broke off after it started: it can't be retried transparently."""

    status = 502
    error_type = "server_error"
    default_code = "upstream_error"


Keep = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Outcome:
    """Filled in while the response is sent: whether the deployment misbehaved."""

    failed: bool = False


def _set_usage(rec: RequestRecord, usage: dict[str, Any]) -> None:
    details = usage.get("prompt_tokens_details") or {}
    rec.set_usage(
        Usage(int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), int(details.get("cached_tokens") or 0))
    )


async def call_json(
    upstream: Upstream,
    path: str,
    body: dict[str, Any],
    rec: RequestRecord,
    *,
    count: Callable[[str], int],
    headers: dict[str, str] | None = None,
    relay: tuple[str, ...] = (),
    keep: Keep | None = None,
) -> Response:
    """`headers`: extra request headers; `relay`: response headers of the upstream's passed on to the client; `keep`:
    given the answer's body (it never raises)."""
    data, upstream_headers = await upstream.post(path, body, headers)
    if not isinstance(data.get("usage"), dict):
        data["usage"] = usage_of(count, body, completion_text(data))
    _set_usage(rec, data["usage"])
    if data.get("choices"):
        rec.first_token()
        if keep is not None:  # before the reply, as the engine's answers are: the next identical request hits
            await keep(data)
    response = json_response(data)
    for name in relay:
        if name in upstream_headers:
            response.headers[name] = upstream_headers[name]
    return response


async def call_stream(
    upstream: Upstream,
    path: str,
    body: dict[str, Any],
    rec: RequestRecord,
    *,
    count: Callable[[str], int],
    limits: StreamLimits,
    outcome: Outcome,
    headers: dict[str, str] | None = None,
    keep: Keep | None = None,
) -> Response:
    """`keep`: given the answer as a JSON body once the stream ended cleanly, if it was one choice of plain text."""
    want_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    events = upstream.stream(path, {**body, "stream_options": {"include_usage": True}}, headers)
    try:
        first = await anext(events)
    except StopAsyncIteration:
        raise UpstreamError("upstream stream had no events") from None
    except BaseException:
        await events.aclose()
        raise
    if "error" in _parse(first):  # an error event in place of the first chunk: nothing sent yet, retry
        await events.aclose()
        raise UpstreamError("upstream streamed an error before any output")
    chat = path.endswith("/chat/completions")
    answer = _Answer(chat, keep) if keep is not None else None
    relay = _relay(first, events, body, want_usage, rec=rec, count=count, answer=answer, chat=chat)

    def on_error(exc: BaseException, err: GatewayError) -> None:
        outcome.failed = True
        rec.error_type = err.error_type

    return ChatStream(relay, _relayed, on_error, 1, engine_streams=[events], limits=limits,
                      on_disconnect=rec.client_disconnected)


def _relayed(step: Step) -> bytes:
    return b""  # every step carries the upstream's own bytes (or none: a chunk left out)


async def _relay(
    first: bytes,
    events: AsyncGenerator[bytes, None],
    body: dict[str, Any],
    want_usage: bool,
    *,
    rec: RequestRecord,
    count: Callable[[str], int],
    answer: _Answer | None,
    chat: bool,
) -> AsyncGenerator[Step, None]:
    """The upstream's chunks as steps: their events (chat chunks only) and their bytes, relayed as they came."""
    texts: list[str] = []
    usage: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    opened = False
    async with aclosing(events):
        payload: bytes | None = first
        while payload is not None:
            chunk = _parse(payload)
            if isinstance(chunk.get("error"), dict):
                raise UpstreamFailed(f"The upstream failed in the middle of the response: {chunk['error'].get('message')}")
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
                _set_usage(rec, usage)
            if answer is not None:
                answer.absorb(chunk)
            text = delta_text(chunk)
            if text:
                rec.first_token()
                texts.append(text)
            found: list[ChatEvent] = chunk_events(chunk) if chat else []
            if chat and not opened:
                found, opened = [Opened(str(chunk.get("model") or "")), *found], True
            last = chunk or last
            keep_chunk = want_usage or chunk.get("choices") or not usage  # drop the usage-only chunk nobody asked for
            if keep_chunk:
                sent(chunk)
            yield Step(tuple(found), b"data: " + payload + b"\n\n" if keep_chunk else b"")
            payload = await _next(events)
    if usage is None:
        usage = usage_of(count, body, "".join(texts))
        _set_usage(rec, usage)
        extra = {k: last.get(k) for k in ("id", "object", "created", "model")}
        wire = b"data: " + orjson.dumps({**extra, "choices": [], "usage": usage}) + b"\n\n" if want_usage else b""
        yield Step((UsageReport(usage),) if chat else (), wire)
    if answer is not None and (kept := answer.body("".join(texts), usage)) is not None:
        await answer.keep(kept)


class _Answer:
    """A streamed answer put back together as the JSON body it stands for; None unless it was one choice of plain
    text that finished (a tool call, logprobs or a second choice could not be replayed from it)."""

    def __init__(self, chat: bool, keep: Keep) -> None:
        self.chat, self.keep = chat, keep
        self.head: dict[str, Any] = {}
        self.finish: str | None = None
        self.plain = True

    def absorb(self, chunk: dict[str, Any]) -> None:
        if not self.head and chunk.get("id"):
            self.head = {k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk}
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") if self.chat else {}
            if choice.get("index", 0) != 0 or choice.get("logprobs") or not isinstance(delta, dict) or any(
                v not in (None, "", []) for k, v in delta.items() if k not in ("role", "content")
            ):
                self.plain = False
            self.finish = choice.get("finish_reason") or self.finish

    def body(self, text: str, usage: dict[str, Any]) -> dict[str, Any] | None:
        """The answer as a JSON body would carry it (the keeper gives it the shape it stores)."""
        if not self.plain or self.finish is None:
            return None
        content = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return {**self.head, "choices": [{"index": 0, **content, "finish_reason": self.finish}], "usage": usage}


async def _next(events: AsyncGenerator[bytes, None]) -> bytes | None:
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None
    except UpstreamError as exc:
        raise UpstreamFailed(f"The upstream stopped in the middle of the response ({exc}). Retry the request.") from exc


def _parse(payload: bytes) -> dict[str, Any]:
    try:
        chunk = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return {}
    return chunk if isinstance(chunk, dict) else {}
