"""ResponseBuilder: the Response object and its stream events, built from what the chat pipeline produced.

One state machine serves both shapes: the chat answer's events (gateway/protocol/events.py), streamed or those
of a whole answer (gateway/protocol/answer.py's ChatAnswer), are fed in: text deltas, tool-call starts and argument
fragments, a finish reason and usage; the builder keeps the output items and returns the Responses events each
step produces (`sequence_number` counts up from 0). A non-streaming request drops the events and keeps the final
object, so both paths answer the same."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gateway.errors import GatewayError
from gateway.protocol.answer import ChatAnswer
from gateway.protocol.events import ChatEvent, Failed, Opened, TextDelta, ToolCallDelta, ToolCallStart, UsageReport

Event = dict[str, Any]


def response_usage(report: UsageReport) -> dict[str, Any] | None:
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


def response_logprobs(chat_logprobs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """chat `logprobs.content` -> the Responses LogProb list."""
    out = []
    for entry in (chat_logprobs or {}).get("content") or ():
        top = [
            {"token": t["token"], "logprob": t["logprob"], "bytes": t.get("bytes") or []} for t in entry.get("top_logprobs") or ()
        ]
        out.append({"token": entry["token"], "logprob": entry["logprob"], "bytes": entry.get("bytes") or [], "top_logprobs": top})
    return out


class ResponseBuilder:
    def __init__(self, response_id: str, base: Mapping[str, Any], new_id: Callable[[str], str]) -> None:
        self.id = response_id
        self.base = dict(base)
        self.new_id = new_id
        self.created_at = int(time.time())
        self.model = str(base.get("model", ""))
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.message: dict[str, Any] | None = None  # the open message item
        self.calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its open function_call item
        self.open_call: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.status = "in_progress"
        self.error: dict[str, Any] | None = None
        self.started = False

    # ---- the Response object ---------------------------------------------------------------------------

    def response(self) -> dict[str, Any]:
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
            "output": [dict(item) for item in self.output],
            **({"usage": self.usage} if self.usage is not None else {}),  # an object when present (never null)
            **self.base,
        }

    def _event(self, kind: str, **fields: Any) -> Event:
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

    def text(self, delta: str, logprobs: list[dict[str, Any]] | None = None) -> list[Event]:
        if not delta and not logprobs:
            return []
        events = self._close_call() if self.open_call is not None else []
        if self.message is None:
            events += self._open_message()
        part = self.message["content"][0]  # type: ignore[index]
        part["text"] += delta
        part["logprobs"].extend(logprobs or ())
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=self.message["id"],  # type: ignore[index]
                output_index=len(self.output) - 1,
                content_index=0,
                delta=delta,
                logprobs=logprobs or [],
            )
        )
        return events

    def call_start(self, index: int, call_id: str, name: str) -> list[Event]:
        events = self._close_message() + (self._close_call() if self.open_call is not None else [])
        item = {
            "id": self.new_id("fc_"),
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call_id,
            "name": name,
        }
        self.output.append(item)
        self.calls[index] = self.open_call = item
        events.append(self._event("response.output_item.added", output_index=len(self.output) - 1, item=dict(item)))
        return events

    def call_arguments(self, index: int, fragment: str) -> list[Event]:
        item = self.calls.get(index)
        if item is None or not fragment:
            return []
        item["arguments"] += fragment
        output_index = self.output.index(item)
        return [
            self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=output_index, delta=fragment)
        ]

    def finish(self, reason: str | None) -> None:
        self.finish_reason = reason or self.finish_reason

    def set_usage(self, report: UsageReport) -> None:
        self.usage = response_usage(report) or self.usage

    def complete(self) -> list[Event]:
        """Close the open items; the final response.completed (or .incomplete) event."""
        events = self._open_message() if not self.output else []  # no text, no calls: one empty message
        events += self._close_message() + (self._close_call() if self.open_call is not None else [])
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
            if item["status"] == "in_progress":
                item["status"] = "incomplete"
        events.append(self._event("response.failed", response=self.response()))
        return events

    # ---- items -------------------------------------------------------------------------------------------

    def _item_status(self) -> str:
        return "incomplete" if self.finish_reason == "length" else "completed"

    def _open_message(self) -> list[Event]:
        self.message = {"id": self.new_id("msg_"), "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
        self.output.append(self.message)
        output_index = len(self.output) - 1
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
        events = [self._event("response.output_item.added", output_index=output_index, item=_copy(self.message))]
        self.message["content"].append(part)
        events.append(
            self._event(
                "response.content_part.added",
                item_id=self.message["id"],
                output_index=output_index,
                content_index=0,
                part=dict(part),
            )
        )
        return events

    def _close_message(self) -> list[Event]:
        item = self.message
        if item is None:
            return []
        self.message = None
        output_index = self.output.index(item)
        part = item["content"][0]
        item["status"] = self._item_status()
        common = {"item_id": item["id"], "output_index": output_index, "content_index": 0}
        return [
            self._event("response.output_text.done", **common, text=part["text"], logprobs=list(part["logprobs"])),
            self._event("response.content_part.done", **common, part=_copy(part)),
            self._event("response.output_item.done", output_index=output_index, item=_copy(item)),
        ]

    def _close_call(self) -> list[Event]:
        item = self.open_call
        assert item is not None
        self.open_call = None
        output_index = self.output.index(item)
        item["status"] = self._item_status()
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=output_index,
                name=item["name"],
                arguments=item["arguments"],
            ),
            self._event("response.output_item.done", output_index=output_index, item=dict(item)),
        ]


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot of an item (its content parts copied, so later deltas don't change sent events)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [{**p, "logprobs": list(p.get("logprobs") or [])} for p in out["content"]]
    return out


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


def feed_completion(builder: ResponseBuilder, answer: ChatAnswer) -> dict[str, Any]:
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
