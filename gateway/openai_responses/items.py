"""Input items: validate a Responses `input` into stored item objects, and turn items into chat messages.

Items are kept in the API's own resource shapes (what GET /v1/responses/{id}/input_items returns):
messages with `input_text` parts (user, system, developer) or `output_text` parts (assistant),
`function_call` and `function_call_output` items, each with an id. The chat pipeline then sees them as
ordinary chat messages: an assistant turn with `tool_calls`, a `tool` message per call output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import InvalidRequest

_MESSAGE_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text")
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_UNSUPPORTED_ITEMS = {
    "reasoning": "this model produces no reasoning items.",
    "item_reference": "item references are not supported: send the items themselves, or previous_response_id.",
    "file_search_call": "built-in tools are not available on this server.",
    "web_search_call": "built-in tools are not available on this server.",
    "computer_call": "built-in tools are not available on this server.",
    "computer_call_output": "built-in tools are not available on this server.",
    "code_interpreter_call": "built-in tools are not available on this server.",
    "image_generation_call": "built-in tools are not available on this server.",
    "local_shell_call": "built-in tools are not available on this server.",
    "local_shell_call_output": "built-in tools are not available on this server.",
    "mcp_call": "MCP tools are not available on this server.",
    "mcp_list_tools": "MCP tools are not available on this server.",
    "mcp_approval_request": "MCP tools are not available on this server.",
    "mcp_approval_response": "MCP tools are not available on this server.",
    "custom_tool_call": "custom (free-form) tools are not available on this server: use function tools.",
    "custom_tool_call_output": "custom (free-form) tools are not available on this server: use function tools.",
}
_MESSAGE_KEYS = {"type", "role", "content", "id", "status", "phase"}
_CALL_KEYS = {"type", "call_id", "name", "arguments", "id", "status"}
_OUTPUT_KEYS = {"type", "call_id", "output", "id", "status"}

NewId = Callable[[str], str]  # prefix -> a fresh id with that prefix


def parse_input(raw: object, new_id: NewId) -> list[dict[str, Any]]:
    """`input` (a string or an array of items) -> item resources with ids."""
    if isinstance(raw, str):
        return [_message_item("user", [raw], new_id("msg_"), None)]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'input' must be a string or a non-empty array of input items.", param="input")
    return [_item(f"input[{i}]", item, new_id) for i, item in enumerate(raw)]


def _item(where: str, item: object, new_id: NewId) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param=where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        return _message(where, item, new_id)
    if kind == "function_call":
        return _function_call(where, item, new_id)
    if kind == "function_call_output":
        return _function_output(where, item, new_id)
    if isinstance(kind, str) and kind in _UNSUPPORTED_ITEMS:
        raise InvalidRequest(
            f"Input item type '{kind}' in '{where}' is not supported: {_UNSUPPORTED_ITEMS[kind]}", param=f"{where}.type"
        )
    raise InvalidRequest(
        f"Invalid value for '{where}.type': {kind!r}. Supported input items: 'message', 'function_call', 'function_call_output'.",
        param=f"{where}.type",
    )


def _reject_unknown(where: str, item: dict[str, Any], known: set[str]) -> None:
    for key in item:
        if key not in known:
            raise InvalidRequest(f"Unknown parameter: '{where}.{key}'.", param=f"{where}.{key}")


def _opt_id(where: str, item: dict[str, Any]) -> str | None:
    value = item.get("id")
    if value is not None and not isinstance(value, str):
        raise InvalidRequest(f"Invalid type for '{where}.id': expected a string.", param=f"{where}.id")
    return value or None


def _message(where: str, item: dict[str, Any], new_id: NewId) -> dict[str, Any]:
    _reject_unknown(where, item, _MESSAGE_KEYS)
    role = item.get("role")
    if role not in _MESSAGE_ROLES:
        raise InvalidRequest(
            f"Invalid value for '{where}.role': {role!r}. Supported values are: 'user', 'system', 'developer' and 'assistant'.",
            param=f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        texts = [content]
    elif isinstance(content, list):
        texts = [_text_part(f"{where}.content[{j}]", part, role) for j, part in enumerate(content)]
    else:
        raise InvalidRequest(
            f"Invalid type for '{where}.content': expected a string or an array of content parts.", param=f"{where}.content"
        )
    return _message_item(role, texts, _opt_id(where, item) or new_id("msg_"), item.get("status"))


def _text_part(where: str, part: object, role: str) -> str:
    if not isinstance(part, dict):
        raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param=where)
    kind = part.get("type")
    if kind in _MEDIA_PARTS:
        raise InvalidRequest(f"Content part type '{kind}' is not supported: this model reads text only.", param=f"{where}.type")
    if kind == "refusal" and role == "assistant":
        text = part.get("refusal")
    elif kind in _TEXT_PARTS:
        text = part.get("text")
    else:
        raise InvalidRequest(
            f"Invalid value for '{where}.type': {kind!r}; expected 'input_text' or 'output_text'.", param=f"{where}.type"
        )
    if not isinstance(text, str):
        raise InvalidRequest(f"Invalid type for '{where}.text': expected a string.", param=f"{where}.text")
    return text


def _message_item(role: str, texts: list[str], item_id: str, status: object) -> dict[str, Any]:
    if role == "assistant":
        parts = [{"type": "output_text", "text": t, "annotations": [], "logprobs": []} for t in texts]
        return {"id": item_id, "type": "message", "role": role, "status": "completed", "content": parts}
    status = status if status in ("in_progress", "completed", "incomplete") else "completed"
    return {
        "id": item_id,
        "type": "message",
        "role": role,
        "status": status,
        "content": [{"type": "input_text", "text": t} for t in texts],
    }


def _req_str(where: str, item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"Missing required parameter: '{where}.{key}' (a non-empty string).", param=f"{where}.{key}")
    return value


def _function_call(where: str, item: dict[str, Any], new_id: NewId) -> dict[str, Any]:
    _reject_unknown(where, item, _CALL_KEYS)
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise InvalidRequest(f"Missing required parameter: '{where}.arguments' (a JSON string).", param=f"{where}.arguments")
    return {
        "id": _opt_id(where, item) or new_id("fc_"),
        "type": "function_call",
        "status": "completed",
        "call_id": _req_str(where, item, "call_id"),
        "name": _req_str(where, item, "name"),
        "arguments": arguments,
    }


def _function_output(where: str, item: dict[str, Any], new_id: NewId) -> dict[str, Any]:
    _reject_unknown(where, item, _OUTPUT_KEYS)
    output = item.get("output")
    if isinstance(output, list):
        output = "\n".join(_text_part(f"{where}.output[{j}]", part, "tool") for j, part in enumerate(output))
    if not isinstance(output, str):
        raise InvalidRequest(f"Missing required parameter: '{where}.output' (a string).", param=f"{where}.output")
    return {
        "id": _opt_id(where, item) or new_id("fco_"),
        "type": "function_call_output",
        "status": "completed",
        "call_id": _req_str(where, item, "call_id"),
        "output": output,
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
