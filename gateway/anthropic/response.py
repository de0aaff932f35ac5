"""The pieces of an Anthropic Message that its stream (stream.py) and the whole Message (fold.py) share.

- stop_reason: finish_reason stop -> end_turn (or stop_sequence when the text ends with one of the
  request's stop_sequences: the chat request asked for it to be included, and it is cut off here),
  length -> max_tokens (model_context_window_exceeded when max_tokens was lowered to fit the context
  window), tool_calls -> tool_use.
- tool calls -> tool_use blocks with their arguments parsed into `input`; ids `toolu_...`.
- usage: input_tokens + cache_read_input_tokens = the prompt's tokens (those the prefix cache held are read from
  it), output_tokens = the completion's.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from gateway.protocol.answer import BadUpstreamShape
from gateway.protocol.events import UsageReport

_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


def tool_use_id(call_id: str) -> str:
    """`call_abc` -> `toolu_abc` (the id a client sends back in its tool_result)."""
    return "toolu_" + (call_id[5:] if call_id.startswith("call_") else call_id)


def split_stop(text: str, finish: str | None, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(the text without the stop sequence that ended it, that sequence) — or (text, None)."""
    if finish != "stop" or not stops:
        return text, None
    matched = [s for s in stops if text.endswith(s)]
    if not matched:
        return text, None
    stop = max(matched, key=len)
    return text[: len(text) - len(stop)], stop


def stop_reason(finish: str | None, stop_sequence: str | None, window: bool = False) -> str:
    """`window`: max_tokens was lowered to what the context window had left."""
    if stop_sequence is not None:
        return "stop_sequence"
    if finish == "length" and window:
        return "model_context_window_exceeded"
    return _REASONS.get(finish or "stop", "end_turn")


def usage(report: UsageReport | None) -> dict[str, int]:
    """Anthropic's counts: `input_tokens` are the prompt's tokens the prefix cache did not hold, which it did are
    `cache_read_input_tokens` (the three input counts add up to the prompt; nothing is billed for writing here).
    All zero when the answer reported no usage."""
    if report is None:
        return {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0}
    cached = report.cached_tokens
    return {
        "input_tokens": report.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": report.completion_tokens,
    }


def tool_input(arguments: str) -> dict[str, object]:
    """A tool call's JSON arguments as the `input` object of its tool_use block."""
    if not arguments:
        return {}
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise BadUpstreamShape("The model's tool call arguments are not valid JSON.") from None
    if not isinstance(value, dict):
        raise BadUpstreamShape("The model's tool call arguments are not a JSON object.")
    return value


@dataclass(frozen=True)
class Shape:
    """What a Message says beyond the chat answer: its id, the model asked for, the request's stop sequences, and
    whether max_tokens was lowered to fit the context window."""

    message_id: str
    model: str
    stops: tuple[str, ...]
    window: bool = False
