"""Cached responses in the shape the request asked for: a JSON body, or an SSE stream whose chunks
are built like a live stream's (role chunk, content, finish_reason, then the usage chunk when
include_usage is set). Usage is the original generation's, marked `"cached": true`."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from typing import Any

from gateway.protocol.answer import ChatAnswer
from gateway.protocol.events import Step
from gateway.protocol.sse import DONE, sse_data

_CHAT_MESSAGE_KEYS = {"role", "content", "refusal"}


def replayable(body: dict[str, Any]) -> bool:
    """Only plain-text answers are stored: anything else (tool calls...) could not be replayed as a stream."""
    choices = body.get("choices") or []
    if not choices:
        return False
    if body.get("object") == "chat.completion":
        messages = [c.get("message", {}) for c in choices]
        return all(k in _CHAT_MESSAGE_KEYS or v in (None, []) for m in messages for k, v in m.items())
    return True


def cached_usage(body: dict[str, Any]) -> dict[str, Any]:
    return {**body["usage"], "cached": True}


def rebrand(body: dict[str, Any], completion_id: str) -> dict[str, Any]:
    """The stored body under this request's id and time, usage marked as cached."""
    return {**body, "id": completion_id, "created": int(time.time()), "usage": cached_usage(body)}


def _chat_chunk(head: dict[str, Any], choices: list[dict[str, Any]], include_usage: bool) -> bytes:
    obj = {**head, "choices": choices}
    if include_usage:
        obj["usage"] = None
    return sse_data(obj)


def chat_chunks(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    out = []
    for c in body["choices"]:
        i, message = c["index"], c["message"]
        role = {"role": "assistant", "content": "", "refusal": None}
        out.append(_chat_chunk(head, [{"index": i, "delta": role, "logprobs": None, "finish_reason": None}], include_usage))
        if message.get("content") or c.get("logprobs"):
            delta = {"index": i, "delta": {"content": message.get("content") or ""}, "logprobs": c.get("logprobs")}
            out.append(_chat_chunk(head, [{**delta, "finish_reason": None}], include_usage))
        finish = {"index": i, "delta": {}, "logprobs": None, "finish_reason": c["finish_reason"]}
        out.append(_chat_chunk(head, [finish], include_usage))
    if include_usage:
        out.append(sse_data({**head, "choices": [], "usage": body["usage"]}))
    return out


def completion_chunks(body: dict[str, Any], include_usage: bool) -> list[bytes]:
    head = {"id": body["id"], "object": "text_completion", "created": body["created"], "model": body["model"]}
    out = [sse_data({**head, "choices": [choice]}) for choice in body["choices"]]
    if include_usage:
        out.append(sse_data({**head, "choices": [], "usage": body["usage"]}))
    return out


async def chat_steps(body: dict[str, Any], include_usage: bool) -> AsyncGenerator[Step, None]:
    """The whole answer as one step: its events, and its chunks' bytes in one write."""
    yield Step(tuple(ChatAnswer.of(body).events()), b"".join(chat_chunks(body, include_usage)))


async def events(chunks: list[bytes]) -> AsyncGenerator[bytes, None]:
    """The whole answer in one write, then [DONE]."""
    yield b"".join(chunks)
    yield DONE
