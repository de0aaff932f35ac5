"""ResponseBuilder: the Response object and its stream events, built from what the chat pipeline produced.

One state machine serves both shapes: the chat answer's events (gateway/protocol/events.py), streamed or those
of a whole answer (gateway/protocol/answer.py's ChatAnswer), are fed in: text deltas, tool-call starts and argument
fragments, a finish reason and usage; the builder keeps the output items and returns the Responses events each
step produces (`sequence_number` counts up from 0). A non-streaming request drops the events and keeps the final
object, so both paths answer the same."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import GatewayError
from gateway.protocol.answer import ChatAnswer
from gateway.protocol.events import ChatEvent, Failed, Opened, TextDelta, ToolCallDelta, ToolCallStart, UsageReport

Event = dict[str, object]
LogProb = dict[str, object]  # one token's entry of a Responses `logprobs` list


def response_usage(report: UsageReport) -> dict[str, object] | None:
    """The Responses usage object of the chat answer's usage (None for an empty one)."""
    if not report.usage:
        return None
    prompt, completion = report.prompt_tokens, report.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": report.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_logprobs(chat_logprobs: Mapping[str, Any] | None) -> list[LogProb]:
    """chat `logprobs.content` -> the Responses LogProb list."""
    out: list[LogProb] = []
    for entry in (chat_logprobs or {}).get("content") or ():
        top = [
            {"token": t["token"], "logprob": t["logprob"], "bytes": t.get("bytes") or []} for t in entry.get("top_logprobs") or ()
        ]
        out.append({"token": entry["token"], "logprob": entry["logprob"], "bytes": entry.get("bytes") or [], "top_logprobs": top})
    return out


@dataclass(eq=False)
class _Message:
    """An assistant message item, its one output_text part once added (`parted`)."""

    id: str
    status: str = "in_progress"
    parted: bool = False
    text: str = ""
    logprobs: list[LogProb] = field(default_factory=list)

    def part(self) -> dict[str, object]:
        return {"type": "output_text", "annotations": [], "logprobs": list(self.logprobs), "text": self.text}

    def item(self) -> dict[str, object]:
        """The item as it is now (a snapshot: later deltas don't change what was sent)."""
        content = [self.part()] if self.parted else []
        return {"id": self.id, "type": "message", "status": self.status, "content": content, "role": "assistant"}


@dataclass(eq=False)
class _Call:
    """A function_call item, its arguments as they arrived so far."""

    id: str
    call_id: str
    name: str
    status: str = "in_progress"
    arguments: str = ""

    def item(self) -> dict[str, object]:
        return {"id": self.id, "type": "function_call", "status": self.status, "arguments": self.arguments,
                "call_id": self.call_id, "name": self.name}  # fmt: skip


class ResponseBuilder:
    def __init__(self, response_id: str, base: Mapping[str, object], new_id: Callable[[str], str]) -> None:
        self.id = response_id
        self.base = dict(base)
        self.new_id = new_id
        self.created_at = int(time.time())
        self.model = str(base.get("model", ""))
        self.seq = 0
        self.output: list[_Message | _Call] = []
        self.message: _Message | None = None  # the open message item
        self.calls: dict[int, _Call] = {}  # chat tool-call index -> its function_call item
        self.open_call: _Call | None = None
        self.finish_reason: str | None = None
        self.usage: object = None  # the Responses usage object (None: none reported)
        self.status = "in_progress"
        self.error: dict[str, str] | None = None
        self.started = False

    # ---- the Response object ---------------------------------------------------------------------------

    def response(self) -> dict[str, object]:
        incomplete = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": int(time.time()) if self.status == "completed" else None,
            "error": self.error,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": [item.item() for item in self.output],
            **({"usage": self.usage} if self.usage is not None else {}),  # an object when present (never null)
            **self.base,
        }

    def _event(self, kind: str, **fields: object) -> Event:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    # ---- inputs ------------------------------------------------------------------------------------------

    def start(self, model: str) -> list[Event]:
        if self.started:
            return []
        self.started = True
        self.model = model or self.model
        snapshot = self.response()
        return [self._event("response.created", response=snapshot), self._event("response.in_progress", response=snapshot)]

    def text(self, delta: str, logprobs: list[LogProb] | None = None) -> list[Event]:
        if not delta and not logprobs:
            return []
        events = self._close_call()
        if self.message is None:
            events += self._open_message()
        message = self.message
        assert message is not None
        message.text += delta
        message.logprobs.extend(logprobs or ())
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=message.id,
                output_index=len(self.output) - 1,
                content_index=0,
                delta=delta,
                logprobs=logprobs or [],
            )
        )
        return events

    def call_start(self, index: int, call_id: str, name: str) -> list[Event]:
        events = self._close_message() + self._close_call()
        call = _Call(self.new_id("fc_"), call_id, name)
        self.output.append(call)
        self.calls[index] = self.open_call = call
        events.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=call.item()))
        return events

    def call_arguments(self, index: int, fragment: str) -> list[Event]:
        call = self.calls.get(index)
        if call is None or not fragment:
            return []
        call.arguments += fragment
        output_index = self.output.index(call)
        return [
            self._event("response.function_call_arguments.delta", item_id=call.id, output_index=output_index, delta=fragment)
        ]

    def finish(self, reason: str | None) -> None:
        self.finish_reason = reason or self.finish_reason

    def set_usage(self, report: UsageReport) -> None:
        self.usage = response_usage(report) or self.usage

    def complete(self) -> list[Event]:
        """Close the open items; the final response.completed (or .incomplete) event."""
        events = self._open_message() if not self.output else []  # no text, no calls: one empty message
        events += self._close_message() + self._close_call()
        self.status = "incomplete" if self.finish_reason == "length" else "completed"
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        events.append(self._event(kind, response=self.response()))
        return events

    def fail(self, err: GatewayError) -> list[Event]:
        """The stream broke: an `error` event, then response.failed (open items end incomplete)."""
        events = [self._event("error", code=err.code or err.error_type, message=err.message, param=err.param)]
        self.status = "failed"
        code = "rate_limit_exceeded" if err.status == 429 else "server_error"
        self.error = {"code": code, "message": err.message}
        for item in self.output:
            if item.status == "in_progress":
                item.status = "incomplete"
        events.append(self._event("response.failed", response=self.response()))
        return events

    # ---- items -------------------------------------------------------------------------------------------

    def _item_status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def _open_message(self) -> list[Event]:
        message = self.message = _Message(self.new_id("msg_"))
        self.output.append(message)
        output_index = len(self.output) - 1
        events = [self._event("response.output_item.added", output_index=output_index, item=message.item())]
        message.parted = True
        events.append(
            self._event(
                "response.content_part.added",
                item_id=message.id,
                output_index=output_index,
                content_index=0,
                part=message.part(),
            )
        )
        return events

    def _close_message(self) -> list[Event]:
        message = self.message
        if message is None:
            return []
        self.message = None
        output_index = self.output.index(message)
        message.status = self._item_status()
        common = {"item_id": message.id, "output_index": output_index, "content_index": 0}
        return [
            self._event("response.output_text.done", **common, text=message.text, logprobs=list(message.logprobs)),
            self._event("response.content_part.done", **common, part=message.part()),
            self._event("response.output_item.done", output_index=output_index, item=message.item()),
        ]

    def _close_call(self) -> list[Event]:
        call = self.open_call
        if call is None:
            return []
        self.open_call = None
        output_index = self.output.index(call)
        call.status = self._item_status()
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=call.id,
                output_index=output_index,
                name=call.name,
                arguments=call.arguments,
            ),
            self._event("response.output_item.done", output_index=output_index, item=call.item()),
        ]


# ---- feeding chat output in -------------------------------------------------------------------------------


def feed_events(builder: ResponseBuilder, events: Iterable[ChatEvent]) -> list[Event]:
    """The chat answer's events (choice 0: Responses has no `n`) -> the Responses events they make."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, Opened):
            out += builder.start(e.model)
        elif isinstance(e, UsageReport):
            builder.set_usage(e)
        elif isinstance(e, Failed) or e.choice != 0:
            continue
        elif isinstance(e, TextDelta):
            out += builder.text(e.text, response_logprobs(e.logprobs) if e.logprobs else None)
        elif isinstance(e, ToolCallStart):
            out += builder.call_start(e.call, e.id, e.name)
        elif isinstance(e, ToolCallDelta):
            out += builder.call_arguments(e.call, e.arguments)
        else:
            builder.finish(e.reason)
    return out


def feed_completion(builder: ResponseBuilder, answer: ChatAnswer) -> dict[str, object]:
    """A whole chat answer (its first choice) -> the final Response object: the fold of the events its stream would
    carry."""
    feed_events(builder, answer.first().events())
    builder.complete()
    return builder.response()


def replay_events(builder: ResponseBuilder, stored: Mapping[str, Any]) -> list[Event]:
    """A stored Response as the events a live stream of it would have sent (GET ...?stream=true)."""
    events = builder.start(str(stored.get("model") or ""))
    for item in stored.get("output") or ():
        if item.get("type") == "message":
            part = (item.get("content") or [{}])[0]
            events += builder.text(part.get("text") or "", part.get("logprobs") or None)
        elif item.get("type") == "function_call":
            events += builder.call_start(len(builder.output), item["call_id"], item["name"])
            events += builder.call_arguments(len(builder.output) - 1, item.get("arguments") or "")
    builder.usage = stored.get("usage")
    builder.finish("length" if stored.get("status") == "incomplete" else "stop")
    return events + builder.complete()
