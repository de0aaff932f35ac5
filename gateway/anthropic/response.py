"""A chat.completion -> an Anthropic Message; the pieces the stream translator shares.

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
from typing import Any

import orjson

from gateway.errors import GatewayError

_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"}


class BadUpstreamShape(GatewayError):
    """The chat answer could not be read as one (an upstream that speaks another dialect)."""

    status = 502
    error_type = "server_error"
    default_code = "upstream_error"


def tool_use_id(call_id: object) -> str:
    """`call_abc` -> `toolu_abc` (the id a client sends back in its tool_result)."""
    text = str(call_id or "")
    return "toolu_" + (text[5:] if text.startswith("call_") else text)


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


def usage(chat_usage: object) -> dict[str, int]:
    """Anthropic's counts: `input_tokens` are the prompt's tokens the prefix cache did not hold, which it did are
    `cache_read_input_tokens` (the three input counts add up to the prompt; nothing is billed for writing here)."""
    u = chat_usage if isinstance(chat_usage, dict) else {}
    details = u.get("prompt_tokens_details")
    cached = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
    return {
        "input_tokens": int(u.get("prompt_tokens") or 0) - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": int(u.get("completion_tokens") or 0),
    }


def tool_input(arguments: object) -> dict[str, Any]:
    if arguments in (None, ""):
        return {}
    try:
        value = orjson.loads(arguments) if isinstance(arguments, str | bytes) else arguments
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


def message(chat: dict[str, Any], message_id: str, model: str, stops: tuple[str, ...], *, window: bool = False) -> dict[str, Any]:
    """The Anthropic Message for a chat.completion body (its first choice: Messages has no `n`)."""
    try:
        choice = chat["choices"][0]
        msg = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise BadUpstreamShape("The model's answer came back in an unexpected shape.") from None
    finish = choice.get("finish_reason")
    text, stop = split_stop(msg.get("content") or "", finish, stops)
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.get("id")),
                "name": fn.get("name"),
                "input": tool_input(fn.get("arguments")),
            }
        )
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": chat.get("model") or model,
        "content": content,
        "stop_reason": stop_reason(finish, stop, window),
        "stop_sequence": stop,
        "usage": usage(chat.get("usage")),
    }
