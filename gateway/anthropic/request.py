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
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import Field

from gateway.errors import InvalidRequest
from gateway.protocol import fields as f
from gateway.protocol.declared import ANTHROPIC, Declared, Hint, Int, Only, Refused, left_out
from gateway.protocol.fields import Body

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # the chat pipeline's limit (gateway/protocol/tools.py)
MAX_STOP_SEQUENCES = 16  # the engine's limit (SamplingParams)
_NO_THINKING = "this model has no extended thinking: it answers without thinking, as with thinking off"
_EFFORT = Hint("this model has no effort levels: every answer is generated alike")


class _Anthropic(Declared):
    wording = ANTHROPIC


class OutputConfig(_Anthropic):
    format: dict[str, Any] | None = None  # a JSON schema for the answer (constrained decoding): _output_config
    effort: Annotated[Any, _EFFORT] = None


class TurnOutputConfig(_Anthropic):
    effort: Annotated[Any, _EFFORT] = None


class MessageParam(_Anthropic):
    """One turn; its content blocks are read by _user / _assistant / _system."""

    role: Literal["user", "assistant", "system"]  # system: Claude Code's per-turn system text
    content: str | list[Any]
    output_config: TurnOutputConfig | None = None  # a turn's own settings (Claude Code's per-turn control)


class Metadata(_Anthropic):
    user_id: str | None = None  # the access log's and the spend ledger's end user


class CountTokensBody(_Anthropic):
    """POST /v1/messages/count_tokens: every field a client may send (the prompt's fields)."""

    model: str
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None  # client tools; server tools are left out (_tool)
    tool_choice: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    speed: Annotated[Literal["standard"] | None, Only("only the standard speed is served here.")] = None
    thinking: Annotated[Any, Hint(_NO_THINKING, neutral=lambda v: isinstance(v, dict) and v.get("type") == "disabled")] = None
    context_management: Annotated[Any, Hint("nothing to clear: no thinking or tool results are kept between requests")] = None
    cache_control: Annotated[Any, Hint("the prefix cache reuses every shared prompt prefix by itself "
                                       "(no breakpoints needed)")] = None
    service_tier: Annotated[Any, Hint("one tier here")] = None
    inference_geo: Annotated[Any, Hint("one place here")] = None
    diagnostics: Annotated[Any, Hint("no diagnostics are collected")] = None
    user_profile_id: Annotated[Any, Hint("no profiles here")] = None
    workspace_id: Annotated[Any, Hint("no workspaces here")] = None
    container: Annotated[Any, Refused("code execution containers are not available on this server.")] = None
    mcp_servers: Annotated[Any, Refused("MCP connectors are not available on this server.")] = None


_Body = TypeVar("_Body", bound=CountTokensBody)


class MessagesBody(CountTokensBody):
    """POST /v1/messages: every field a client may send."""

    max_tokens: Annotated[Int, Field(ge=1)]  # a cap here: the context left, or the key's max_tokens (endpoint.py)
    stop_sequences: Annotated[list[Annotated[str, Field(min_length=1)]] | None, Field(max_length=MAX_STOP_SEQUENCES)] = None
    stream: bool | None = None
    temperature: Annotated[float | None, Field(ge=0, le=1)] = None
    top_p: Annotated[float | None, Field(ge=0, le=1)] = None
    top_k: Annotated[Int | None, Field(ge=0)] = None
    metadata: Metadata | None = None
    cache: Any = None  # smolgate's response-cache control, as on chat


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


def _messages(raw: list[dict[str, Any]], system: str | None) -> list[dict[str, Any]]:
    """The turns (their fields checked by MessageParam) as chat messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, msg in enumerate(raw):
        where = f"messages[{i}]"
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


def _common(body: Body, chat: dict[str, Any], declared: type[_Body], strict: bool) -> tuple[_Body, str, tuple[str, ...]]:
    """What a create and a count_tokens request share: the prompt, tools, output format.

    Returns the declared request, the prefill (a final assistant message's text, "" without one) and the tools
    left out."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", "")
    req = declared.parse(body, strict_params=strict)
    _thinking(body.get("thinking"))
    chat["messages"] = _messages(body["messages"], _system(body.get("system")))
    last = chat["messages"][-1]
    prefill = last["content"] if last["role"] == "assistant" and not last.get("tool_calls") else ""
    if last["role"] == "assistant" and not prefill:
        where = f"messages[{len(body['messages']) - 1}]"
        raise _bad(f"'{where}': a final assistant message must hold text to continue (a prefill).", where)
    if prefill:
        chat["continue_final_message"] = True  # the vLLM extension: the template leaves the turn open
    dropped = _tools(body, chat, strict)
    _output_config(body.get("output_config"), chat)
    return req, prefill, dropped


def translate(body: Body, strict: bool = False) -> MessagesRequest:
    """POST /v1/messages body -> the chat body to serve (400 for anything this server cannot honour)."""
    chat: dict[str, Any] = {}
    req, prefill, dropped = _common(body, chat, MessagesBody, strict)
    chat = {"model": req.model, **chat, "max_tokens": req.max_tokens}
    for key in ("temperature", "top_p", "top_k"):
        if req.given(key):
            chat[key] = getattr(req, key)
    stops = tuple(dict.fromkeys(req.stop_sequences or ()))
    if stops:
        chat["stop"] = list(stops)
        chat["include_stop_str_in_output"] = True  # so the answer can say which sequence stopped it
    if req.metadata is not None and req.metadata.user_id is not None:
        chat["user"] = req.metadata.user_id
    if req.cache is not None:
        chat["cache"] = req.cache
    if req.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    return MessagesRequest(req.model, chat, bool(req.stream), stops, prefill, dropped)


def translate_count(body: Body, strict: bool = False) -> tuple[str, dict[str, Any]]:
    """POST /v1/messages/count_tokens body -> (model, a chat body whose prompt is the one to count)."""
    chat: dict[str, Any] = {}
    req, _, _ = _common(body, chat, CountTokensBody, strict)
    return req.model, {"model": req.model, **chat}
