"""Tool calling in the chat history: assistant `tool_calls` and `tool` results as template text.

The same format the model is asked to produce (gateway/protocol/tools.py): an assistant turn's calls become
`<tool_call>{"name":...,"arguments":...}</tool_call>` after its content, and a tool result becomes a
user turn `<tool_response>RESULT</tool_response>` (SmolLM2's template knows no `tool` role).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import InvalidRequest
from gateway.protocol.tools import CLOSE, OPEN


def assistant_calls_text(where: str, calls: object) -> str:
    if not isinstance(calls, list):
        raise InvalidRequest(f"'{where}.tool_calls' must be an array.", param=f"{where}.tool_calls")
    return "".join(_call_text(f"{where}.tool_calls[{j}]", call) for j, call in enumerate(calls))


def _call_text(where: str, call: object) -> str:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
        raise InvalidRequest(f"'{where}' must have function.name and function.arguments strings.", param=where)
    try:
        args: Any = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
    except json.JSONDecodeError:
        args = fn["arguments"]  # kept as the client sent it
    return OPEN + json.dumps({"name": fn["name"], "arguments": args}, separators=(",", ":")) + CLOSE


def tool_result_message(where: str, msg: dict[str, Any], content: str) -> dict[str, Any]:
    if not isinstance(msg.get("tool_call_id"), str):
        raise InvalidRequest(f"Missing required parameter: '{where}.tool_call_id'.", param=f"{where}.tool_call_id")
    return {"role": "user", "content": f"<tool_response>{content}</tool_response>"}


def with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """Append `text` to the leading system message, or put one first."""
    if messages and messages[0]["role"] == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{text}".strip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
