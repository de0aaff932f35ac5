"""Tool calls in OpenAI's response shapes: the chat.completion message and the streamed deltas.

Non-streaming: the choice's text is parsed whole into `content` and `tool_calls`. Streaming: each
choice has its own incremental parser; a call starts with a delta carrying `id`, `type` and
`function.name` (arguments ""), then `function.arguments` arrives as string fragments, all with the
call's `index`. A choice that called a tool and stopped ends with `finish_reason: "tool_calls"`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backend.engine.outputs import CompletionDelta
from gateway.protocol.generation import finish_reason
from gateway.protocol.tool_parser import Arguments, CallStart, Content, Event, ToolCallParser, parse_all


def _reason(engine_reason: str | None, called: bool) -> str | None:
    reason = finish_reason(engine_reason)
    return "tool_calls" if called and reason == "stop" else reason


def with_tool_calls(body: dict[str, Any], new_id: Callable[[], str]) -> dict[str, Any]:
    """A chat.completion body whose choices' text may hold tool calls -> content + tool_calls."""
    for choice in body["choices"]:
        message = choice["message"]
        content, calls = parse_all(message["content"] or "")
        if not calls:
            continue
        message["content"] = content or None
        message["tool_calls"] = [
            {"id": new_id(), "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
        choice["finish_reason"] = "tool_calls" if choice["finish_reason"] == "stop" else choice["finish_reason"]
    return body


def _delta(event: Event, new_id: Callable[[], str]) -> dict[str, Any]:
    if isinstance(event, Content):
        return {"content": event.text}
    if isinstance(event, CallStart):
        call = {"index": event.index, "id": new_id(), "type": "function", "function": {"name": event.name, "arguments": ""}}
        return {"tool_calls": [call]}
    return {"tool_calls": [{"index": event.index, "function": {"arguments": event.fragment}}]}


def _coalesce(events: list[Event]) -> list[Event]:
    """Adjacent argument fragments of one call become one fragment (one chunk per engine step)."""
    out: list[Event] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, Arguments) and isinstance(last, Arguments) and last.index == e.index:
            out[-1] = Arguments(e.index, last.fragment + e.fragment)
        else:
            out.append(e)
    return out


@dataclass
class ToolStream:
    """Per-choice parsers turning streamed text deltas into content / tool_calls chunk choices."""

    new_id: Callable[[], str]
    parsers: dict[int, ToolCallParser] = field(default_factory=dict)

    def choices(self, d: CompletionDelta) -> list[dict[str, Any]]:
        parser = self.parsers.setdefault(d.index, ToolCallParser())
        events = parser.feed(d.text)
        if d.finish_reason is not None:
            events += parser.finish()
        out: list[dict[str, Any]] = [
            {"index": d.index, "delta": _delta(e, self.new_id), "logprobs": None, "finish_reason": None}
            for e in _coalesce(events)
        ]
        if d.finish_reason is not None:
            reason = _reason(d.finish_reason, parser.calls > 0)
            out.append({"index": d.index, "delta": {}, "logprobs": None, "finish_reason": reason})
        return out
