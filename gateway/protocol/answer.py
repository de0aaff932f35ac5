"""The chat pipeline's JSON answer taken in process, by the endpoints that build on it (/v1/responses,
/v1/messages): whatever produced it (the embedded engine, a cache replay, an upstream through the router), the
response runs as the ASGI app it is, so everything it does when it ends (close an upstream attempt, spend
rate-limit tokens) still happens. A streamed answer is not read back: its typed steps are taken
(gateway/protocol/events.py, steps_of).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message, Scope

from gateway.errors import InternalError


@dataclass
class Captured:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)


class InnerError(InternalError):
    """The chat pipeline answered with an error body (or an unreadable one): its status and OpenAI body are kept."""

    def __init__(self, status: int, body: Any) -> None:
        err = body.get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        super().__init__(
            str(err.get("message") or "The chat pipeline answered with an unexpected body."),
            param=err.get("param"),
            code=err.get("code"),
        )
        if err:
            self.error_type = str(err.get("type") or "server_error")
        self.answer_status, self.body = status, body


async def _never() -> Message:
    await asyncio.Event().wait()  # the outer response watches the client; cancelling this task ends the inner one
    raise AssertionError("unreachable")


async def run_json(response: Response, scope: Scope) -> tuple[Captured, dict[str, Any]]:
    """Run a non-streaming response to its end; its status, headers and JSON body (InnerError unless a 200 with an
    object)."""
    captured = Captured()
    chunks: list[bytes] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            captured.status = message["status"]
            captured.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", ())}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await response(scope, _never, send)
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        body = None
    if captured.status != 200 or not isinstance(body, dict):
        raise InnerError(captured.status, body)
    return captured, body
