"""The chat pipeline's answer as one in-process stream of typed events, whatever produced it.

The embedded engine (gateway/api/chat.py), a cache replay (gateway/cache/ticket.py) and an upstream's chat
chunks (gateway/routing/proxy.py) each produce `Step`s: the events of one write (one engine step, one upstream
chunk). Chat Completions SSE, Responses events and Messages events are renderers of them, so no endpoint reads
another's SSE bytes back. A step may carry `wire`: the chat chunks' bytes as they were made (an upstream's own,
relayed as they came; a replay's), which the Chat Completions renderer sends as they are. A whole chat.completion
is the same answer at once (gateway/protocol/answer.py, `ChatAnswer`): its `events()` are those its stream carries.

Indices: `choice` is the choice's index (n > 1); `call` a tool call's index within its choice.
Logprobs and usage are OpenAI's chat JSON (`logprobs` of a chunk's choice; a chat usage object), the shape all
three producers have them in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from gateway.errors import GatewayError, InternalError


@dataclass(frozen=True)
class Opened:
    """The answer's head: the model that answers (an upstream's own name for it)."""

    model: str


@dataclass(frozen=True)
class TextDelta:
    choice: int
    text: str
    logprobs: Mapping[str, Any] | None = None  # chat `logprobs`: {"content": [...], ...}


@dataclass(frozen=True)
class ToolCallStart:
    choice: int
    call: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallDelta:
    choice: int
    call: int
    arguments: str  # a fragment of the call's JSON arguments


@dataclass(frozen=True)
class Finish:
    choice: int
    reason: str  # OpenAI's: stop | length | tool_calls | content_filter


def _count(value: object) -> int:
    """A token count as the usage object has it (absent or null: 0)."""
    return int(value) if isinstance(value, int | float | str) and value else 0


@dataclass(frozen=True)
class UsageReport:
    usage: Mapping[str, object]  # a chat usage object (prompt_tokens, completion_tokens, prompt_tokens_details...)

    @property
    def prompt_tokens(self) -> int:
        return _count(self.usage.get("prompt_tokens"))

    @property
    def completion_tokens(self) -> int:
        return _count(self.usage.get("completion_tokens"))

    @property
    def cached_tokens(self) -> int:
        details = self.usage.get("prompt_tokens_details")
        return _count(details.get("cached_tokens")) if isinstance(details, Mapping) else 0


@dataclass(frozen=True)
class Failed:
    """The answer broke off after it started (the error was reported where it happened); nothing follows."""

    error: GatewayError


ChatEvent = Opened | TextDelta | ToolCallStart | ToolCallDelta | Finish | UsageReport | Failed


@dataclass(frozen=True)
class Step:
    events: tuple[ChatEvent, ...]
    wire: bytes | None = None  # these events as chat chunks' SSE bytes, when they came (or were made) as such


class Steps:
    """An answer's steps, with what must happen when it is over (abort the engine request, close the upstream
    attempt): `aclose` runs it once, whether or not the steps were read (an async generator never started
    would skip its `finally`)."""

    def __init__(self, steps: AsyncIterator[Step], on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self._steps = steps
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> Steps:
        return self

    async def __anext__(self) -> Step:
        return await anext(self._steps)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            aclose = getattr(self._steps, "aclose", None)
            if aclose is not None:
                with suppress(RuntimeError):  # already running elsewhere: its owner closes it
                    await aclose()
        finally:
            if self._on_close is not None:
                await self._on_close()


def steps_of(response: object) -> Steps:
    """The steps of the chat pipeline's streamed answer (a ChatStream, or the router's Tracked around one)."""
    steps = getattr(response, "steps", None)
    if steps is None:
        raise InternalError("The chat pipeline answered a stream request without a stream.")
    return steps()  # type: ignore[no-any-return]


def chunk_events(chunk: Mapping[str, Any]) -> list[ChatEvent]:
    """One chat.completion.chunk (an upstream's, already read from its SSE) as events. The first chunk of a
    stream also gives `Opened` (see `opened`)."""
    out: list[ChatEvent] = []
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, Mapping):
            continue
        index = int(choice.get("index") or 0)
        delta = choice.get("delta") or {}
        logprobs = choice.get("logprobs") or None
        if delta.get("content") or logprobs:
            out.append(TextDelta(index, delta.get("content") or "", logprobs))
        for call in delta.get("tool_calls") or ():
            call_index = int(call.get("index") or 0)
            fn = call.get("function") or {}
            if call.get("id"):
                out.append(ToolCallStart(index, call_index, str(call["id"]), str(fn.get("name") or "")))
            if fn.get("arguments"):
                out.append(ToolCallDelta(index, call_index, str(fn["arguments"])))
        if choice.get("finish_reason"):
            out.append(Finish(index, str(choice["finish_reason"])))
    if isinstance(chunk.get("usage"), Mapping):
        out.append(UsageReport(chunk["usage"]))
    return out

