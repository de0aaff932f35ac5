"""Input items: a Responses `input` (declared in params.py) as stored item objects, and items as chat messages.

Items are kept in the API's own resource shapes (what GET /v1/responses/{id}/input_items returns):
messages with `input_text` parts (user, system, developer) or `output_text` parts (assistant),
`function_call` and `function_call_output` items, each with an id. The chat pipeline then sees them as
ordinary chat messages: an assistant turn with `tool_calls`, a `tool` message per call output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import InvalidRequest
from gateway.openai_responses.params import (
    UNREAD_ITEMS,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputText,
    Item,
    MediaPart,
    MessageItem,
    OutputText,
    Part,
)

NewId = Callable[[str], str]  # prefix -> a fresh id with that prefix


def parse_input(given: str | list[Item], new_id: NewId) -> list[dict[str, Any]]:
    """`input` (a string or an array of declared items) -> item resources with ids."""
    if isinstance(given, str):
        return [_message_item("user", [given], new_id("msg_"), None)]
    if not given:
        raise InvalidRequest("'input' must be a string or a non-empty array of input items.", param="input")
    return [_item(f"input[{i}]", item, new_id) for i, item in enumerate(given)]


def _item(where: str, item: Item, new_id: NewId) -> dict[str, Any]:
    if isinstance(item, MessageItem):
        return _message(where, item, new_id)
    if isinstance(item, FunctionCallItem):
        return {
            "id": item.id or new_id("fc_"), "type": "function_call", "status": "completed", "call_id": item.call_id,
            "name": item.name, "arguments": item.arguments,
        }  # fmt: skip
    if isinstance(item, FunctionCallOutputItem):
        output = item.output if isinstance(item.output, str) else "\n".join(
            _text(f"{where}.output[{j}]", part, "tool") for j, part in enumerate(item.output))  # fmt: skip
        return {"id": item.id or new_id("fco_"), "type": "function_call_output", "status": "completed",
                "call_id": item.call_id, "output": output}  # fmt: skip
    raise InvalidRequest(
        f"Input item type '{item.type}' in '{where}' is not supported: {UNREAD_ITEMS[item.type]}", param=f"{where}.type"
    )


def _message(where: str, item: MessageItem, new_id: NewId) -> dict[str, Any]:
    content = item.content
    texts = [content] if isinstance(content, str) else [
        _text(f"{where}.content[{j}]", part, item.role) for j, part in enumerate(content)]  # fmt: skip
    return _message_item(item.role, texts, item.id or new_id("msg_"), item.status)


def _text(where: str, part: Part, role: str) -> str:
    if isinstance(part, InputText | OutputText):
        return part.text
    if isinstance(part, MediaPart):
        raise InvalidRequest(f"Content part type '{part.type}' is not supported: this model reads text only.",
                             param=f"{where}.type")  # fmt: skip
    if role != "assistant":  # a refusal is an assistant's
        raise InvalidRequest(
            f"Invalid value for '{where}.type': 'refusal'; expected 'input_text' or 'output_text'.", param=f"{where}.type"
        )
    return part.refusal


def _message_item(role: str, texts: list[str], item_id: str, status: str | None) -> dict[str, Any]:
    if role == "assistant":
        parts = [{"type": "output_text", "text": t, "annotations": [], "logprobs": []} for t in texts]
        return {"id": item_id, "type": "message", "role": role, "status": "completed", "content": parts}
    return {
        "id": item_id,
        "type": "message",
        "role": role,
        "status": status or "completed",
        "content": [{"type": "input_text", "text": t} for t in texts],
    }


def chat_messages(items: list[dict[str, Any]], first_new: int) -> list[dict[str, Any]]:
    """Items (earlier context first, then this request's input from index `first_new`) -> chat messages.

    Consecutive function calls become one assistant turn with `tool_calls` (joined to the assistant text
    before them); every call output must answer a call made earlier in the conversation."""
    messages: list[dict[str, Any]] = []
    calls: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i - first_new}]" if i >= first_new else "previous_response_id"
        kind = item["type"]
        if kind == "message":
            role = item["role"]
            text = "\n".join(p.get("text") or p.get("refusal") or "" for p in item["content"])
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            calls.add(item["call_id"])
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if item["call_id"] not in calls:
                raise InvalidRequest(f"No tool call found for function call output with call_id {item['call_id']}.", param=where)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    if not messages:
        raise InvalidRequest("'input' holds no messages.", param="input")
    return messages
