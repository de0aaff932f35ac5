"""Chat messages: validate OpenAI message objects and turn them into chat-template dicts."""

from __future__ import annotations

from typing import Any

from gateway.errors import InvalidRequest
from gateway.protocol.tool_messages import assistant_calls_text, tool_result_message

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_UNSUPPORTED_KEYS = ("function_call", "audio")
_TOOL_KEYS = ("tool_calls", "tool_call_id", *_UNSUPPORTED_KEYS)
_KNOWN_KEYS = {"role", "content", "name", "refusal", *_TOOL_KEYS}


def template_messages(raw: object) -> list[dict[str, Any]]:
    """`messages` from the request body -> [{"role", "content"[, "name"]}] for apply_chat_template."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'messages' must be a non-empty array of message objects.", param="messages")
    return [_message(i, m) for i, m in enumerate(raw)]


def _message(i: int, msg: object) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise InvalidRequest(f"'{where}' must be an object.", param=where)
    for key in msg:
        if key not in _KNOWN_KEYS:
            raise InvalidRequest(f"Unrecognized argument in '{where}': {key}", param=f"{where}.{key}")
    role = msg.get("role")
    if role == "function":
        raise InvalidRequest(f"'{where}.role' 'function' is deprecated: use 'tool'.", param=f"{where}.role")
    if role == "tool":
        return tool_result_message(where, msg, _content(where, role, msg.get("content")))
    if role not in _ROLES:
        raise InvalidRequest(f"Invalid value for '{where}.role': {role!r}.", param=f"{where}.role")
    for key in (*_UNSUPPORTED_KEYS, "tool_call_id") if role == "assistant" else _TOOL_KEYS:
        if msg.get(key) not in (None, []):
            raise InvalidRequest(f"'{where}.{key}' is not supported by this server.", param=f"{where}.{key}")
    content = _content(where, role, msg.get("content"))
    if role == "assistant" and msg.get("tool_calls"):
        content += assistant_calls_text(where, msg["tool_calls"])
    out: dict[str, Any] = {"role": _ROLES[role], "content": content}
    name = msg.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise InvalidRequest(f"'{where}.name' must be a string.", param=f"{where}.name")
        out["name"] = name
    return out


def _content(where: str, role: str, content: object) -> str:
    if content is None and role == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text_part(f"{where}.content[{j}]", part) for j, part in enumerate(content))
    raise InvalidRequest(f"'{where}.content' must be a string or an array of content parts.", param=f"{where}.content")


def _text_part(where: str, part: object) -> str:
    if not isinstance(part, dict):
        raise InvalidRequest(f"'{where}' must be an object.", param=where)
    kind = part.get("type")
    if kind != "text":
        raise InvalidRequest(f"Content part type {kind!r} is not supported: this model only reads text.", param=f"{where}.type")
    text = part.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"'{where}.text' must be a string.", param=f"{where}.text")
    return text
