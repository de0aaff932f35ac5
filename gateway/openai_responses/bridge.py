"""Running the chat pipeline's JSON response in process and reading it back: a chat.completion body, whatever
produced it (the embedded engine, a cache replay, an upstream through the router). The inner response runs as
the ASGI app it is, so everything it does when it ends (close an upstream attempt, spend rate-limit tokens) still
happens. A streamed answer is not read back: its typed steps are taken (gateway/protocol/events.py, steps_of).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
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


def passed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The inner response's cache and routing headers, for the outer one."""
    return {k: v for k, v in headers.items() if k.startswith(_PASSED_HEADERS)}


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
    out.error_type = str(err.get("type") or "server_error")  # type: ignore[misc]
    return out


class StreamBroke(GatewayError):
    """The chat stream failed (its OpenAI error body is kept)."""

    def __init__(self, body: dict[str, Any]) -> None:
        err = body.get("error") if isinstance(body.get("error"), dict) else {}
        super().__init__(str(err.get("message") or "The stream failed."), param=err.get("param"), code=err.get("code"))
        self.error_type = str(err.get("type") or "server_error")  # type: ignore[misc]
        self.status = 429 if self.error_type == "rate_limit_error" else 500  # type: ignore[misc]
