"""The chat pipeline's JSON answer taken in process, by the endpoints that build on it (/v1/responses,
/v1/messages), and read once into a typed `ChatAnswer`: whatever produced it (the embedded engine, a cache replay, an
upstream through the router), the response runs as the ASGI app it is, so everything it does when it ends (close an
upstream attempt, spend rate-limit tokens) still happens. A streamed answer is not read back: its typed steps are
taken (gateway/protocol/events.py, steps_of).

A `ChatAnswer` is the same answer its stream would have been: `events()` are the events a stream of it carries, so the
endpoints render a whole answer with the code that folds a streamed one. A body that is not a chat.completion (an
upstream that speaks another dialect) is a `BadUpstreamShape`, said once here for every endpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from starlette.responses import Response
from starlette.types import Message, Scope

from gateway.errors import GatewayError, InternalError
from gateway.protocol.events import ChatEvent, Finish, Opened, TextDelta, ToolCallDelta, ToolCallStart, UsageReport

_T = TypeVar("_T")
UNEXPECTED = "The model's answer came back in an unexpected shape."


class BadUpstreamShape(GatewayError):
    """The chat answer could not be read as one (an upstream that speaks another dialect)."""

    status = 502
    error_type = "server_error"
    default_code = "upstream_error"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the call's JSON arguments, as text


@dataclass(frozen=True)
class AnswerChoice:
    index: int
    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str  # OpenAI's: stop | length | tool_calls | content_filter ("stop" when the answer named none)
    logprobs: Mapping[str, Any] | None  # chat `logprobs` ({"content": [...]}), as events carry it


@dataclass(frozen=True)
class ChatAnswer:
    """A whole chat.completion, typed: the answering model, its choices, its usage (a chat usage object, None when
    the body had none)."""

    model: str
    choices: tuple[AnswerChoice, ...]
    usage: UsageReport | None

    @staticmethod
    def of(body: Mapping[str, object]) -> ChatAnswer:
        """A chat.completion body read (BadUpstreamShape unless its choices are chat choices with a message)."""
        usage = body.get("usage")
        return ChatAnswer(
            str(body.get("model") or ""),
            tuple(_choice(c) for c in _get(body, "choices", list, [])),
            UsageReport(usage) if isinstance(usage, Mapping) else None,
        )

    def first(self) -> ChatAnswer:
        """Only the first choice, as choice 0 (Messages and Responses have no `n`)."""
        return ChatAnswer(self.model, tuple(_renumbered(c) for c in self.choices[:1]), self.usage)

    def events(self) -> list[ChatEvent]:
        """The events a stream of this answer carries, in order: what a cache replay streams, and what the endpoints
        built on the chat pipeline fold into their own answer."""
        out: list[ChatEvent] = [Opened(self.model)]
        for c in self.choices:
            if c.text or c.logprobs:
                out.append(TextDelta(c.index, c.text, c.logprobs))
            for i, call in enumerate(c.tool_calls):
                out.append(ToolCallStart(c.index, i, call.id, call.name))
                if call.arguments:
                    out.append(ToolCallDelta(c.index, i, call.arguments))
            out.append(Finish(c.index, c.finish_reason))
        if self.usage is not None:
            out.append(self.usage)
        return out


def _renumbered(c: AnswerChoice) -> AnswerChoice:
    return AnswerChoice(0, c.text, c.tool_calls, c.finish_reason, c.logprobs)


def _get(obj: Mapping[str, object], key: str, kind: type[_T], default: _T) -> _T:
    """`obj[key]` when it is a `kind`, `default` when absent or null; any other value is not a chat answer."""
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise BadUpstreamShape(UNEXPECTED)
    return value


def _object(value: object) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise BadUpstreamShape(UNEXPECTED)
    return value


def _choice(raw: object) -> AnswerChoice:
    choice = _object(raw)
    message = _object(choice.get("message"))
    calls: Sequence[object] = _get(message, "tool_calls", list, [])
    return AnswerChoice(
        _get(choice, "index", int, 0),
        _get(message, "content", str, ""),
        tuple(_tool_call(call) for call in calls),
        _get(choice, "finish_reason", str, "") or "stop",
        _get(choice, "logprobs", Mapping, None),
    )


def _tool_call(raw: object) -> ToolCall:
    call = _object(raw)
    fn = _object(call.get("function") or {})
    arguments = fn.get("arguments")
    if isinstance(arguments, Mapping):  # some upstreams send the arguments as an object, not as its JSON
        arguments = orjson.dumps(arguments).decode()
    return ToolCall(str(call.get("id") or ""), str(fn.get("name") or ""), arguments if isinstance(arguments, str) else "")


@dataclass
class Captured:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)


class InnerError(InternalError):
    """The chat pipeline answered with an error body (or an unreadable one): its status and OpenAI body are kept."""

    def __init__(self, status: int, body: object) -> None:
        found = body.get("error") if isinstance(body, dict) else None
        err: Mapping[str, object] = found if isinstance(found, dict) else {}
        message, param, code = err.get("message"), err.get("param"), err.get("code")
        super().__init__(
            str(message or "The chat pipeline answered with an unexpected body."),
            param=param if isinstance(param, str) else None,
            code=code if isinstance(code, str) else None,
        )
        if err:
            self.error_type = str(err.get("type") or "server_error")
        self.answer_status, self.body = status, body


async def _never() -> Message:
    await asyncio.Event().wait()  # the outer response watches the client; cancelling this task ends the inner one
    raise AssertionError("unreachable")


async def run_json(response: Response, scope: Scope) -> tuple[Captured, ChatAnswer]:
    """Run a non-streaming chat response to its end; its status, headers and answer (InnerError unless a 200 with an
    object; BadUpstreamShape when that object is not a chat.completion)."""
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
    return captured, ChatAnswer.of(body)
