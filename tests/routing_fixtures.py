"""Fixtures for the routing tests: a misbehaving OpenAI-compatible upstream (a real HTTP server on a free
port) and a helper that serves gateway apps under uvicorn in a background thread.

The fake upstream is the one stand-in of these tests: it exists to show faults on demand. Each server
plays a script of behaviours, one per request, then `default`:
  ok            a chat.completion / text_completion (SSE when asked), with usage
  ok_no_usage   the same without usage (the gateway must count it)
  500           an OpenAI error body with status 500
  429:N         status 429 with Retry-After: N
  400           an invalid_request_error
  hang          accept, then never answer (the gateway's timeouts must fire)
  drop          stream two chunks, then close the connection without [DONE]
  odd           a JSON answer in a loose shape some providers send: no `object`, no choice `index`, usage
                without prompt_tokens
  tool          a JSON answer that calls a tool
  dialect       a 200 JSON answer in another dialect: a text_completion's choices on the chat path
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import uvicorn
from gateway_fixtures import _bound_socket
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = ["Hello", " from", " the", " fake", " upstream", "."]


@dataclass
class Servers:
    """uvicorn servers for ASGI apps, on free ports, in one background event loop."""

    urls: list[str] = field(default_factory=list)
    _servers: list[uvicorn.Server] = field(default_factory=list)
    _thread: threading.Thread | None = None

    def start(self, apps: list[Any]) -> list[str]:
        sockets = [_bound_socket() for _ in apps]
        self.urls = [f"http://127.0.0.1:{s.getsockname()[1]}" for s in sockets]
        config = {"log_level": "warning", "access_log": False, "timeout_graceful_shutdown": 1}
        self._servers = [uvicorn.Server(uvicorn.Config(app, **config)) for app in apps]  # type: ignore[arg-type]

        async def serve() -> None:
            await asyncio.gather(*(s.serve(sockets=[k]) for s, k in zip(self._servers, sockets, strict=True)))

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name="uvicorn-routing", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not all(s.started for s in self._servers):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the routing test servers did not start")
            time.sleep(0.02)
        return self.urls

    def stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


@dataclass
class FakeUpstream:
    """An OpenAI-compatible server that misbehaves on cue; `received` counts requests per path."""

    name: str
    default: str = "ok"
    script: deque[str] = field(default_factory=deque)
    received: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each request's headers
    cache_verdict: str = ""  # when set, JSON answers carry `x-cache: <it>` (as a backend replica's do)

    def play(self, *behaviours: str, default: str | None = None) -> None:
        self.script = deque(behaviours)
        self.received = 0
        self.bodies = []
        self.headers = []
        if default is not None:
            self.default = default

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._chat, methods=["POST"]),
            ]
        )

    async def _chat(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.received += 1
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        behaviour = self.script.popleft() if self.script else self.default
        chat = request.url.path.endswith("/chat/completions")
        if behaviour == "500":
            return JSONResponse(_error("The upstream exploded.", "server_error"), status_code=500)
        if behaviour.startswith("429"):
            headers = {"retry-after": behaviour.split(":")[1]} if ":" in behaviour else {}
            return JSONResponse(_error("Slow down.", "rate_limit_error"), status_code=429, headers=headers)
        if behaviour == "400":
            return JSONResponse(_error("Bad temperature, says the upstream.", "invalid_request_error"), status_code=400)
        if behaviour == "hang":
            await asyncio.sleep(3600)
        usage = behaviour != "ok_no_usage"
        if body.get("stream"):
            return StreamingResponse(self._events(body, chat, usage, drop=behaviour == "drop"), media_type="text/event-stream")
        text = "".join(WORDS)
        if behaviour == "odd":
            odd = {"id": "x-odd", "created": 1, "model": body["model"], "usage": {"total_tokens": 5},
                   "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}  # fmt: skip
            return JSONResponse(odd)
        if behaviour == "dialect":
            return JSONResponse({"id": "x-d", "object": "text_completion", "created": 1, "model": body["model"],
                                 "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})  # fmt: skip
        if behaviour == "tool":
            call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            return JSONResponse({"id": "x-t", "object": "chat.completion", "created": 1, "model": body["model"],
                                 "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": text}} if chat else {"index": 0, "text": text}
        out: dict[str, Any] = {"id": "x-1", "object": "chat.completion" if chat else "text_completion", "created": 1}
        out.update(model=body["model"], choices=[{**choice, "finish_reason": "stop", "logprobs": None}])
        if usage:
            out["usage"] = {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17}
        verdict = {"x-cache": self.cache_verdict} if self.cache_verdict else {}
        return JSONResponse(out, headers={"x-served-by": self.name, **verdict})

    async def _events(self, body: dict[str, Any], chat: bool, usage: bool, drop: bool) -> AsyncIterator[bytes]:
        base = {
            "id": "x-1",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": 1,
            "model": body["model"],
        }
        for i, word in enumerate(WORDS):
            if drop and i == 2:
                raise RuntimeError("simulated connection drop")  # uvicorn closes the connection mid-body
            choice = {"index": 0, "delta": {"content": word}} if chat else {"index": 0, "text": word}
            yield b"data: " + orjson.dumps({**base, "choices": [{**choice, "finish_reason": None}]}) + b"\n\n"
            await asyncio.sleep(0.005)
        end = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
        yield b"data: " + orjson.dumps({**base, "choices": [{**end, "finish_reason": "stop"}]}) + b"\n\n"
        if usage and (body.get("stream_options") or {}).get("include_usage"):
            counts = {"prompt_tokens": 11, "completion_tokens": 6, "total_tokens": 17}
            yield b"data: " + orjson.dumps({**base, "choices": [], "usage": counts}) + b"\n\n"
        yield b"data: [DONE]\n\n"


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
