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
from gateway.protocol.params import ANTHROPIC, USED, Param, Params, hint, left_out, refused

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # the chat pipeline's limit (gateway/protocol/tools.py)
MAX_STOP_SEQUENCES = 16  # the engine's limit (SamplingParams)
_NO_THINKING = "this model has no extended thinking: it answers without thinking, as with thinking off"
# The Messages request, field by field (gateway/protocol/params.py): used, a hint with no effect here, or refused.
_FIELDS: dict[str, Param] = {
    "model": USED, "max_tokens": USED, "messages": USED, "system": USED, "stop_sequences": USED, "stream": USED,
    "temperature": USED, "top_p": USED, "top_k": USED, "tools": USED, "tool_choice": USED, "metadata": USED,
    "output_config": USED, "speed": USED,
    "cache": USED,  # smolgate's response-cache control, as on chat
    "thinking": hint(_NO_THINKING, neutral=lambda v: isinstance(v, dict) and v.get("type") == "disabled"),
    "context_management": hint("nothing to clear: no thinking or tool results are kept between requests"),
    "cache_control": hint("the prefix cache reuses every shared prompt prefix by itself (no breakpoints needed)"),
    "service_tier": hint("one tier here"),
    "inference_geo": hint("one place here"),
    "diagnostics": hint("no diagnostics are collected"),
    "user_profile_id": hint("no profiles here"),
    "workspace_id": hint("no workspaces here"),
    "container": refused("code execution containers are not available on this server."),
    "mcp_servers": refused("MCP connectors are not available on this server."),
}  # fmt: skip
_EFFORT = hint("this model has no effort levels: every answer is generated alike")
_OUTPUT_CONFIG = Params({"format": USED, "effort": _EFFORT}, ANTHROPIC, "output_config")
# a turn's own settings (Claude Code's per-turn control): its effort, a hint like the request's
_MESSAGE = Params(
    {"role": USED, "content": USED, "output_config": USED}, ANTHROPIC, "messages[]",
    nested={"output_config": Params({"effort": _EFFORT}, ANTHROPIC, "messages[].output_config")},
)
_METADATA = Params({"user_id": USED}, ANTHROPIC, "metadata")
_CREATE = Params(_FIELDS, ANTHROPIC, nested={"output_config": _OUTPUT_CONFIG, "metadata": _METADATA})
MESSAGE_PARAMS = _MESSAGE  # docs/clients/fields.md lists its hints too
_COUNT = Params(
    {k: v for k, v in _FIELDS.items() if k not in {"max_tokens", "stop_sequences", "stream", "temperature", "top_p",
                                                    "top_k", "metadata", "cache"}},
    ANTHROPIC, nested={"output_config": _OUTPUT_CONFIG},
)  # fmt: skip
MESSAGES_PARAMS = _CREATE  # docs/clients/fields.md lists its hints (tests/test_docs.py checks)
_BLOCK_WHY = {
    "image": "this model reads text only.",
    "document": "documents (PDF, plain-text sources) are not supported: send their text in a text block.",
    "search_result": "search result blocks are not supported.",
    "container_upload": "code execution containers are not available on this server.",
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


_THINKING_BLOCKS = {"thinking", "redacted_thinking"}  # earlier turns' thinking: dropped, as Anthropic drops it
_THINKING_TYPES = {"enabled", "adaptive", "disabled"}


@dataclass(frozen=True)
class MessagesRequest:
    model: str
    chat: dict[str, Any]  # the Chat Completions body served in its place
    stream: bool
    stop_sequences: tuple[str, ...]
    prefill: str = ""  # a final assistant message's text, which the answer continues
    left_out: tuple[str, ...] = ()  # tools the model was not shown (server tools, deferred tools)


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


def _system(raw: object, path: str = "system") -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise _bad(f"'{path}' must be a string or an array of text blocks.", path)
    texts = []
    for j, block in enumerate(raw):
        where = f"{path}[{j}]"
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
        elif kind not in _THINKING_BLOCKS:
            raise _unsupported_block(kind, path)
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(raw: object, system: str | None, strict: bool) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' must be a non-empty array of message objects.", "messages")
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
        msg = _object(msg, where)
        _MESSAGE.check(msg, strict, where)
        if "content" not in msg:
            raise _bad(f"Missing required parameter: '{where}.content'.", f"{where}.content")
        role = msg.get("role")
        if role == "user":
            out.extend(_user(msg["content"], where))
        elif role == "assistant":  # a final one is a prefill: the answer continues it (translate)
            out.append(_assistant(msg["content"], where))
        elif role == "system":  # Claude Code's per-turn system text: a system message where it was sent
            out.append({"role": "system", "content": _system(msg["content"], f"{where}.content")})
        else:
            raise _bad(
                f"Invalid value for '{where}.role': {role!r}; expected 'user', 'assistant' or 'system'.", f"{where}.role"
            )
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


def _tool(raw: object, i: int, strict: bool) -> dict[str, Any] | None:
    """A client tool as a chat function; None for one the model is not shown (under strict_params: a 400)."""
    where = f"tools[{i}]"
    tool = _object(raw, where)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        left_out(strict, ANTHROPIC, f"{where}.type", f"server tools ({kind!r}) are not available on this server.")
        return None
    _reject_extra(tool, _TOOL_KEYS, where)
    name = tool.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"'{where}.name' must match ^[a-zA-Z0-9_-]{{1,64}}$.", f"{where}.name")
    if f.opt_bool(tool, "defer_loading", param=f"{where}.defer_loading"):
        # a deferred tool is outside the prompt until a tool search loads it: here there is none, so it stays out
        left_out(strict, ANTHROPIC, f"{where}.defer_loading", "there is no tool search on this server.")
        return None
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
        if name not in {t["function"]["name"] for t in chat["tools"]}:
            raise _bad(f"'tool_choice.name' {name!r} is not among the tools this model is shown.", "tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise _bad(
            f"Invalid value for 'tool_choice.type': {kind!r}; expected 'auto', 'any', 'tool' or 'none'.", "tool_choice.type"
        )
    if f.opt_bool(choice, "disable_parallel_tool_use", param="tool_choice.disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _tools(body: Body, chat: dict[str, Any], strict: bool) -> tuple[str, ...]:
    """Sets the chat tools and tool_choice; returns the names of the tools left out."""
    raw = body.get("tools")
    dropped: list[str] = []
    if raw is not None:
        if not isinstance(raw, list):
            raise _bad("'tools' must be an array of tool objects.", "tools")
        tools = []
        for i, t in enumerate(raw):
            tool = _tool(t, i, strict)
            if tool is None:
                dropped.append(str(t.get("name") or t.get("type")))
            else:
                tools.append(tool)
        if tools:
            chat["tools"] = tools
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is not None and "tools" not in chat:
        if kind == "none" or (kind == "auto" and dropped):  # auto among tools all left out: nothing to choose
            return tuple(dropped)
        raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
    _tool_choice(choice, chat)
    if "tools" in chat and names_repeat(chat["tools"]):
        raise _bad("Tool names in 'tools' must be unique.", "tools")
    return tuple(dropped)


def names_repeat(tools: list[dict[str, Any]]) -> bool:
    names = [t["function"]["name"] for t in tools]
    return len(set(names)) != len(names)


def _thinking(raw: object) -> None:
    """Any thinking setting is served without thinking (a hint: _FIELDS), but it must be one Anthropic knows."""
    if raw is None:
        return
    kind = _object(raw, "thinking").get("type")
    if kind not in _THINKING_TYPES:
        raise _bad(f"Invalid value for 'thinking.type': {kind!r}; expected 'enabled', 'adaptive' or 'disabled'.", "thinking.type")


def _output_config(raw: object, chat: dict[str, Any]) -> None:
    if raw is None:
        return
    config = _object(raw, "output_config")
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


def _common(body: Body, chat: dict[str, Any], params: Params, strict: bool) -> tuple[str, tuple[str, ...]]:
    """What a create and a count_tokens request share: the prompt, tools, output format.

    Returns the prefill (a final assistant message's text, "" without one) and the tools left out."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", "")
    params.check(body, strict)
    _thinking(body.get("thinking"))
    if body.get("speed") not in (None, "standard"):
        raise _bad("'speed' other than 'standard' is not supported by this server.", "speed")
    chat["messages"] = _messages(body.get("messages"), _system(body.get("system")), strict)
    last = chat["messages"][-1]
    prefill = last["content"] if last["role"] == "assistant" and not last.get("tool_calls") else ""
    if last["role"] == "assistant" and not prefill:
        where = f"messages[{len(body['messages']) - 1}]"
        raise _bad(f"'{where}': a final assistant message must hold text to continue (a prefill).", where)
    if prefill:
        chat["continue_final_message"] = True  # the vLLM extension: the template leaves the turn open
    dropped = _tools(body, chat, strict)
    _output_config(body.get("output_config"), chat)
    return prefill, dropped


def translate(body: Body, strict: bool = False) -> MessagesRequest:
    """POST /v1/messages body -> the chat body to serve (400 for anything this server cannot honour)."""
    chat: dict[str, Any] = {}
    prefill, dropped = _common(body, chat, _CREATE, strict)
    model = f.req_str(body, "model")
    if body.get("max_tokens") is None:
        raise _bad("Missing required parameter: 'max_tokens'.", "max_tokens")
    max_tokens = f.opt_int(body, "max_tokens")
    if max_tokens is None or max_tokens < 1:
        raise _bad("'max_tokens' must be at least 1 on this server (it has no prompt cache to pre-warm).", "max_tokens")
    stream = bool(f.opt_bool(body, "stream"))
    chat = {"model": model, **chat, "max_tokens": max_tokens}
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
        user = f.opt_str(metadata, "user_id", param="metadata.user_id")
        if user is not None:
            chat["user"] = user
    if body.get("cache") is not None:
        chat["cache"] = body["cache"]
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return MessagesRequest(model, chat, stream, stops, prefill, dropped)


def translate_count(body: Body, strict: bool = False) -> tuple[str, dict[str, Any]]:
    """POST /v1/messages/count_tokens body -> (model, a chat body whose prompt is the one to count)."""
    chat: dict[str, Any] = {}
    _common(body, chat, _COUNT, strict)
    return f.req_str(body, "model"), {"model": body["model"], **chat}
