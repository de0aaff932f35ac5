"""Running the chat pipeline's response in process and reading it back: a chat.completion JSON body, or
its stream of chat chunks (SSE), whatever produced it (the embedded engine, a cache replay, an upstream
through the router). The inner response runs as the ASGI app it is, so everything it does when it ends
(abort the engine request, close an upstream attempt, spend rate-limit tokens) still happens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message, Scope

from gateway.errors import GatewayError, InternalError

_PASSED_HEADERS = ("x-cache", "x-cache-similarity", "x-smolgate-")


@dataclass
class Captured:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)


def passed_headers(captured: Captured) -> dict[str, str]:
    """The inner response's cache and routing headers, for the outer one."""
    return {k: v for k, v in captured.headers.items() if k.startswith(_PASSED_HEADERS)}


async def _never() -> Message:
    await asyncio.Event().wait()  # the outer response watches the client; cancelling this task ends the inner one
    raise AssertionError("unreachable")


def _start(captured: Captured, message: Message) -> None:
    captured.status = message["status"]
    captured.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", ())}


async def run_json(response: Response, scope: Scope) -> tuple[Captured, dict[str, Any]]:
    """Run a non-streaming response to its end; its status, headers and JSON body."""
    captured = Captured()
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            _start(captured, message)
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await response(scope, _never, send)
    body = orjson.loads(b"".join(chunks))
    if captured.status != 200 or not isinstance(body, dict):
        raise _inner_error(body)
    return captured, body


def _inner_error(body: Any) -> GatewayError:
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return InternalError("The chat pipeline answered with an unexpected body.")
    out = InternalError(str(err.get("message") or "error"), param=err.get("param"), code=err.get("code"))
    out.error_type = str(err.get("type") or "server_error")
    return out


class StreamBroke(GatewayError):
    """The chat stream ended with an error event (its OpenAI error body is kept)."""

    def __init__(self, body: dict[str, Any]) -> None:
        err = given if isinstance(given := body.get("error"), dict) else {}
        super().__init__(str(err.get("message") or "The stream failed."), param=err.get("param"), code=err.get("code"))
        self.error_type = str(err.get("type") or "server_error")
        self.status = 429 if self.error_type == "rate_limit_error" else 500


async def run_stream(response: Response, scope: Scope) -> tuple[Captured, AsyncGenerator[dict[str, Any], None]]:
    """Start a streaming response; its headers and the chat chunks it sends (an error event raises StreamBroke).

    Closing the chunk iterator (the client left, or the stream ended) cancels the inner response."""
    captured = Captured()
    queue: asyncio.Queue[Message | None] = asyncio.Queue()

    async def send(message: Message) -> None:
        queue.put_nowait(message)

    async def run() -> None:
        try:
            await response(scope, _never, send)
        finally:
            queue.put_nowait(None)

    task = asyncio.ensure_future(run())
    first = await queue.get()
    if first is None or first["type"] != "http.response.start":
        await _stop(task)
        raise InternalError("The chat pipeline ended its stream before it started.")
    _start(captured, first)
    return captured, _chunks(task, queue)


async def _stop(task: asyncio.Future[None]) -> None:
    if not task.done():
        task.cancel()
    with suppress(asyncio.CancelledError, Exception):
        await task


async def _chunks(task: asyncio.Future[None], queue: asyncio.Queue[Message | None]) -> AsyncGenerator[dict[str, Any], None]:
    buf = b""
    try:
        while True:
            message = await queue.get()
            if message is None:
                if not task.cancelled() and (error := task.exception()) is not None:
                    raise error
                return
            buf += message.get("body", b"")
            buf = buf.replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                block, buf = buf.split(b"\n\n", 1)
                event = _parse_event(block)
                if event is not None:
                    yield event
            if not message.get("more_body", False):
                return
    finally:
        await _stop(task)


def _parse_event(block: bytes) -> dict[str, Any] | None:
    name, data = b"", []
    for line in block.split(b"\n"):
        if line.startswith(b"event:"):
            name = line[6:].strip()
        elif line.startswith(b"data:"):
            data.append(line[5:].strip())
    if not data or data == [b"[DONE]"]:
        return None
    payload = orjson.loads(b"\n".join(data))
    if name == b"error" or (isinstance(payload, dict) and isinstance(payload.get("error"), dict) and "choices" not in payload):
        raise StreamBroke(payload if isinstance(payload, dict) else {})
    return payload if isinstance(payload, dict) else None
