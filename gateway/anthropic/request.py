"""A Messages request body -> a Chat Completions body (the gateway's one internal request shape).

Every Anthropic field is either translated, accepted as a no-op (prompt-caching hints, service tier),
or refused with a 400 that names it (images, documents, thinking, server tools, prefill...). Only the
fields the client sent are set on the chat body, so a Messages request and the equivalent chat request
share cache entries.

    system                      -> a leading system message
    messages[].content blocks   -> text; tool_use -> assistant tool_calls; tool_result -> a `tool` message
    max_tokens, temperature, top_p, top_k -> the same; stop_sequences -> stop (+ include_stop_str_in_output,
                                   so the answer says which one matched)
    tools[].input_schema        -> function parameters; tool_choice auto/any/tool/none -> auto/required/named/none
    output_config.format        -> response_format json_schema (constrained decoding)
    metadata.user_id            -> user
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.protocol import fields as f
from gateway.protocol.fields import Body

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # the chat pipeline's limit (gateway/protocol/tools.py)
MAX_STOP_SEQUENCES = 16  # the engine's limit (SamplingParams)
_IGNORED = {"cache_control", "service_tier", "inference_geo", "diagnostics", "user_profile_id", "workspace_id"}
_UNSUPPORTED = {
    "container": "code execution containers are not available on this server.",
    "mcp_servers": "MCP connectors are not available on this server.",
    "context_management": "context management is not available on this server.",
}
_CREATE_KEYS = {
    "model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
    "tools", "tool_choice", "metadata", "thinking", "output_config", "speed",
    "cache",  # smolgate's response-cache control, as on chat
} | _IGNORED | set(_UNSUPPORTED)  # fmt: skip
_COUNT_KEYS = (
    {"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config", "speed"} | _IGNORED | set(_UNSUPPORTED)
)
_BLOCK_WHY = {
    "image": "this model reads text only.",
    "document": "documents (PDF, plain-text sources) are not supported: send their text in a text block.",
    "search_result": "search result blocks are not supported.",
    "container_upload": "code execution containers are not available on this server.",
    "thinking": "this model does not produce thinking blocks.",
    "redacted_thinking": "this model does not produce thinking blocks.",
    "server_tool_use": "server tools are not available on this server.",
    "web_search_tool_result": "server tools are not available on this server.",
    "web_fetch_tool_result": "server tools are not available on this server.",
    "code_execution_tool_result": "server tools are not available on this server.",
    "mcp_tool_use": "MCP connectors are not available on this server.",
    "mcp_tool_result": "MCP connectors are not available on this server.",
}
_TEXT_KEYS = {"type", "text", "cache_control", "citations"}
_TOOL_USE_KEYS = {"type", "id", "name", "input", "cache_control", "caller"}
_TOOL_RESULT_KEYS = {"type", "tool_use_id", "content", "is_error", "cache_control"}
_TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict", "input_examples",
              "eager_input_streaming", "allowed_callers", "defer_loading"}  # fmt: skip


@dataclass(frozen=True)
class MessagesRequest:
    model: str
    chat: dict[str, Any]  # the Chat Completions body served in its place
    stream: bool
    stop_sequences: tuple[str, ...]


def _bad(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _reject_extra(obj: Body, allowed: set[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            name = f"{where}.{key}" if where else key
            raise _bad(f"{name}: Extra inputs are not permitted.", name)


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(f"'{where}' must be an object.", where)
    return value


def _text_block(block: dict[str, Any], where: str) -> str:
    _reject_extra(block, _TEXT_KEYS, where)
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"'{where}.text' must be a string.", f"{where}.text")
    if block.get("citations"):
        raise _bad(f"'{where}.citations' is not supported: this server does not cite documents.", f"{where}.citations")
    return text


def _unsupported_block(kind: object, where: str) -> InvalidRequest:
    why = _BLOCK_WHY.get(str(kind))
    if why is not None:
        return _bad(f"'{where}': content blocks of type {kind!r} are not supported: {why}", f"{where}.type")
    return _bad(f"'{where}.type': unknown content block type {kind!r}.", f"{where}.type")


def _blocks(content: object, where: str) -> list[tuple[str, dict[str, Any]]]:
    """A message's content as (block path, block) pairs; a string is one text block."""
    if isinstance(content, str):
        return [(where, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise _bad(f"'{where}' must be a string or an array of content blocks.", where)
    return [(f"{where}[{j}]", _object(block, f"{where}[{j}]")) for j, block in enumerate(content)]


def _system(raw: object) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise _bad("'system' must be a string or an array of text blocks.", "system")
    texts = []
    for j, block in enumerate(raw):
        where = f"system[{j}]"
        block = _object(block, where)
        if block.get("type") != "text":
            raise _bad(f"'{where}.type' must be 'text': the system prompt holds text blocks only.", f"{where}.type")
        texts.append(_text_block(block, where))
    return "\n".join(texts)


def _tool_result_text(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"'{where}' must be a string or an array of text blocks.", where)
    texts = []
    for j, block in enumerate(content):
        path = f"{where}[{j}]"
        block = _object(block, path)
        if block.get("type") != "text":
            raise _unsupported_block(block.get("type"), path)
        texts.append(_text_block(block, path))
    return "\n".join(texts)


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    _reject_extra(block, _TOOL_RESULT_KEYS, where)
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"Missing required parameter: '{where}.tool_use_id'.", f"{where}.tool_use_id")
    text = _tool_result_text(block.get("content"), f"{where}.content")
    if f.opt_bool(block, "is_error", param=f"{where}.is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _tool_use(block: dict[str, Any], where: str) -> dict[str, Any]:
    _reject_extra(block, _TOOL_USE_KEYS, where)
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise _bad(f"Missing required parameter: '{where}.{key}'.", f"{where}.{key}")
    args = block.get("input", {})
    if not isinstance(args, dict):
        raise _bad(f"'{where}.input' must be an object.", f"{where}.input")
    arguments = orjson.dumps(args).decode()
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _user(content: object, where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results become `tool` messages, its text one user message, in order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for path, block in _blocks(content, f"{where}.content"):
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_block(block, path))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, path))
        else:
            raise _unsupported_block(kind, path)
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: object, where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for path, block in _blocks(content, f"{where}.content"):
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_block(block, path))
        elif kind == "tool_use":
            calls.append(_tool_use(block, path))
        else:
            raise _unsupported_block(kind, path)
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(raw: object, system: str | None) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty array of message objects.", "messages")
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        msg = _object(msg, where)
        _reject_extra(msg, {"role", "content"}, where)
        if "content" not in msg:
            raise _bad(f"Missing required parameter: '{where}.content'.", f"{where}.content")
        role = msg.get("role")
        if role == "user":
            out.extend(_user(msg["content"], where))
        elif role == "assistant":
            if i == len(raw) - 1:
                raise _bad(
                    f"'{where}': a final assistant message (prefill) is not supported by this server: "
                    "end the conversation with a user message.",
                    where,
                )
            out.append(_assistant(msg["content"], where))
        else:
            raise _bad(f"Invalid value for '{where}.role': {role!r}; expected 'user' or 'assistant'.", f"{where}.role")
    return _merged(out)


def _merged(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive user (or assistant) turns are one turn, as Anthropic combines them."""
    out: list[dict[str, Any]] = []
    for msg in messages:
        last = out[-1] if out else None
        if last is None or msg["role"] != last["role"] or msg["role"] not in ("user", "assistant"):
            out.append(msg)
            continue
        merged = {**last, "content": "\n".join(t for t in (last["content"], msg["content"]) if t)}
        calls = [*last.get("tool_calls", ()), *msg.get("tool_calls", ())]
        if calls:
            merged["tool_calls"] = calls
        out[-1] = merged
    return out


def _tool(raw: object, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    tool = _object(raw, where)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise _bad(
            f"'{where}.type' {kind!r}: server tools (web search, code execution, bash, text editor, computer use...) "
            "are not available on this server; define a client tool with name, description and input_schema.",
            f"{where}.type",
        )
    _reject_extra(tool, _TOOL_KEYS, where)
    if tool.get("defer_loading"):
        raise _bad(f"'{where}.defer_loading' is not supported: there is no tool search on this server.", f"{where}.defer_loading")
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"'{where}.name' must match ^[a-zA-Z0-9_-]{{1,64}}$.", f"{where}.name")
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise _bad(f"'{where}.input_schema' must be a JSON schema object.", f"{where}.input_schema")
    if schema.get("type", "object") != "object":
        raise _bad(f"'{where}.input_schema.type' must be 'object'.", f"{where}.input_schema.type")
    description = f.opt_str(tool, "description", param=f"{where}.description") or ""
    function = {"name": name, "description": description, "parameters": schema}
    return {"type": "function", "function": function}


def _tool_choice(raw: object, chat: dict[str, Any]) -> None:
    if raw is None:
        return
    choice = _object(raw, "tool_choice")
    kind = choice.get("type")
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    if kind == "none":
        _reject_extra(choice, {"type"}, "tool_choice")
        chat["tool_choice"] = "none"
        return
    _reject_extra(choice, allowed, "tool_choice")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "tool":
        name = f.req_str(choice, "name", param="tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise _bad(
            f"Invalid value for 'tool_choice.type': {kind!r}; expected 'auto', 'any', 'tool' or 'none'.", "tool_choice.type"
        )
    if f.opt_bool(choice, "disable_parallel_tool_use", param="tool_choice.disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _tools(body: Body, chat: dict[str, Any]) -> None:
    raw = body.get("tools")
    if raw is not None:
        if not isinstance(raw, list):
            raise _bad("'tools' must be an array of tool objects.", "tools")
        if raw:
            chat["tools"] = [_tool(t, i) for i, t in enumerate(raw)]
    choice = body.get("tool_choice")
    if choice is not None and "tools" not in chat:
        if isinstance(choice, dict) and choice.get("type") == "none":
            return
        raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
    _tool_choice(choice, chat)
    if "tools" in chat and names_repeat(chat["tools"]):
        raise _bad("Tool names in 'tools' must be unique.", "tools")


def names_repeat(tools: list[dict[str, Any]]) -> bool:
    names = [t["function"]["name"] for t in tools]
    return len(set(names)) != len(names)


def _thinking(raw: object) -> None:
    if raw is None:
        return
    kind = _object(raw, "thinking").get("type")
    if kind != "disabled":
        raise _bad(f"'thinking' ({kind!r}) is not supported: this model has no extended thinking.", "thinking")


def _output_config(raw: object, chat: dict[str, Any]) -> None:
    if raw is None:
        return
    config = _object(raw, "output_config")
    _reject_extra(config, {"effort", "format"}, "output_config")
    if config.get("effort") is not None:
        raise _bad("'output_config.effort' is not supported: this model has no effort levels.", "output_config.effort")
    fmt = config.get("format")
    if fmt is None:
        return
    fmt = _object(fmt, "output_config.format")
    _reject_extra(fmt, {"type", "schema"}, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise _bad("'output_config.format.type' must be 'json_schema'.", "output_config.format.type")
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _bad("'output_config.format.schema' must be a JSON schema object.", "output_config.format.schema")
    if "tools" in chat and chat.get("tool_choice") != "none":
        raise _bad("'output_config.format' together with 'tools' is not supported by this server.", "output_config.format")
    chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _stop_sequences(body: Body) -> tuple[str, ...]:
    raw = body.get("stop_sequences")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(s, str) and s for s in raw):
        raise _bad("'stop_sequences' must be an array of non-empty strings.", "stop_sequences")
    if len(raw) > MAX_STOP_SEQUENCES:
        raise _bad(f"'stop_sequences' may hold at most {MAX_STOP_SEQUENCES} sequences on this server.", "stop_sequences")
    return tuple(dict.fromkeys(raw))


def _number(body: Body, key: str, lo: float, hi: float) -> float | None:
    value = f.opt_float(body, key)
    if value is not None and not lo <= value <= hi:
        raise _bad(f"'{key}': {value:g} is outside [{lo:g}, {hi:g}].", key)
    return value


def _common(body: Body, chat: dict[str, Any]) -> None:
    """What a create and a count_tokens request share: the prompt, tools, output format."""
    for key, why in _UNSUPPORTED.items():
        if body.get(key) is not None:
            raise _bad(f"'{key}' is not supported: {why}", key)
    _thinking(body.get("thinking"))
    if body.get("speed") not in (None, "standard"):
        raise _bad("'speed' other than 'standard' is not supported by this server.", "speed")
    chat["messages"] = _messages(body.get("messages"), _system(body.get("system")))
    _tools(body, chat)
    _output_config(body.get("output_config"), chat)


def translate(body: Body) -> MessagesRequest:
    """POST /v1/messages body -> the chat body to serve (400 for anything this server cannot honour)."""
    _reject_extra(body, _CREATE_KEYS, "")
    model = f.req_str(body, "model")
    if body.get("max_tokens") is None:
        raise _bad("Missing required parameter: 'max_tokens'.", "max_tokens")
    max_tokens = f.opt_int(body, "max_tokens")
    if max_tokens is None or max_tokens < 1:
        raise _bad("'max_tokens' must be at least 1 on this server (it has no prompt cache to pre-warm).", "max_tokens")
    stream = bool(f.opt_bool(body, "stream"))
    chat: dict[str, Any] = {"model": model}
    _common(body, chat)
    chat["max_tokens"] = max_tokens
    for key, hi in (("temperature", 1.0), ("top_p", 1.0)):
        value = _number(body, key, 0.0, hi)
        if value is not None:
            chat[key] = value
    top_k = f.opt_int(body, "top_k", lo=0)
    if top_k is not None:
        chat["top_k"] = top_k
    stops = _stop_sequences(body)
    if stops:
        chat["stop"] = list(stops)
        chat["include_stop_str_in_output"] = True  # so the answer can say which sequence stopped it
    metadata = f.opt_object(body, "metadata")
    if metadata is not None:
        _reject_extra(metadata, {"user_id"}, "metadata")
        user = f.opt_str(metadata, "user_id", param="metadata.user_id")
        if user is not None:
            chat["user"] = user
    if body.get("cache") is not None:
        chat["cache"] = body["cache"]
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return MessagesRequest(model, chat, stream, stops)


def translate_count(body: Body) -> tuple[str, dict[str, Any]]:
    """POST /v1/messages/count_tokens body -> (model, a chat body whose prompt is the one to count)."""
    _reject_extra(body, _COUNT_KEYS, "")
    model = f.req_str(body, "model")
    chat: dict[str, Any] = {"model": model}
    _common(body, chat)
    return model, chat
