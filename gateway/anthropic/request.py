"""A Messages request body -> a Chat Completions body (the gateway's one internal request shape).

The body is declared (MessagesBody here, the objects inside it in blocks.py), so the translation reads typed
objects. Every Anthropic field is either translated, accepted as a no-op (thinking, prompt-caching hints,
service tier), left out (server tools) or refused with a 400 that names it (images, documents, server tool
blocks, MCP...). Only the fields the client sent are set on the chat body, so a Messages request and the
equivalent chat request share cache entries.

    system                      -> a leading system message
    messages[].content blocks   -> text; tool_use -> assistant tool_calls; tool_result -> a `tool` message
    max_tokens, temperature, top_p, top_k -> the same; stop_sequences -> stop (+ include_stop_str_in_output,
                                   so the answer says which one matched)
    tools[].input_schema        -> function parameters; tool_choice auto/any/tool/none -> auto/required/named/none
    output_config.format        -> response_format json_schema (constrained decoding)
    metadata.user_id            -> user
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import Field

from gateway.anthropic.blocks import (
    UNREAD,
    AnthropicDeclared,
    Block,
    CacheControl,
    ClientTool,
    JsonOutputFormat,
    RedactedThinkingBlock,
    ServerTool,
    TextBlock,
    Thinking,
    ThinkingBlock,
    ThinkingDisabled,
    Tool,
    ToolChoice,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.errors import InvalidRequest
from gateway.protocol.declared import ANTHROPIC, Hint, Int, Only, Refused, left_out
from gateway.protocol.fields import Body

MAX_STOP_SEQUENCES = 16  # the engine's limit (SamplingParams)
_NO_THINKING = "this model has no extended thinking: it answers without thinking, as with thinking off"
_EFFORT = Hint("this model has no effort levels: every answer is generated alike")


class OutputConfig(AnthropicDeclared):
    format: JsonOutputFormat | None = None  # constrained decoding: _output_config
    effort: Annotated[str | None, _EFFORT] = None


class TurnOutputConfig(AnthropicDeclared):
    effort: Annotated[str | None, _EFFORT] = None


class MessageParam(AnthropicDeclared):
    """One turn; which blocks each role may hold is read by _user, _assistant and _texts (system turns)."""

    role: Literal["user", "assistant", "system"]  # system: Claude Code's per-turn system text
    content: str | list[Block]  # a string is one text block
    output_config: TurnOutputConfig | None = None  # a turn's own settings (Claude Code's per-turn control)


class Metadata(AnthropicDeclared):
    user_id: str | None = None  # the access log's and the spend ledger's end user


class CountTokensBody(AnthropicDeclared):
    """POST /v1/messages/count_tokens: every field a client may send (the prompt's fields)."""

    model: str
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None  # client tools; server tools are left out (_tools)
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    speed: Annotated[Literal["standard"] | None, Only("only the standard speed is served here.")] = None
    thinking: Annotated[Thinking | None, Hint(_NO_THINKING, neutral=lambda v: isinstance(v, ThinkingDisabled))] = None
    context_management: Annotated[Any, Hint("nothing to clear: no thinking or tool results are kept between requests")] = None
    cache_control: Annotated[CacheControl | None, Hint("the prefix cache reuses every shared prompt prefix by itself "
                                       "(no breakpoints needed)")] = None
    service_tier: Annotated[str | None, Hint("one tier here")] = None
    inference_geo: Annotated[str | None, Hint("one place here")] = None
    diagnostics: Annotated[Any, Hint("no diagnostics are collected")] = None
    user_profile_id: Annotated[str | None, Hint("no profiles here")] = None
    workspace_id: Annotated[str | None, Hint("no workspaces here")] = None
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


def _unread(block: Block, where: str, turn: str) -> InvalidRequest:
    """A block this server cannot read, or one a turn of this role does not hold."""
    why = UNREAD.get(block.type)
    if why is not None:
        return _bad(f"'{where}': content blocks of type {block.type!r} are not supported: {why}", f"{where}.type")
    return _bad(f"'{where}.type': content blocks of type {block.type!r} are not accepted in {turn}.", f"{where}.type")


def _blocks(content: str | Sequence[Block], where: str) -> list[tuple[str, Block]]:
    """A message's content as (block path, block) pairs; a string is one text block."""
    if isinstance(content, str):
        return [(where, TextBlock(type="text", text=content))]
    return [(f"{where}[{j}]", block) for j, block in enumerate(content)]


def _texts(content: str | Sequence[Block], where: str, holder: str) -> str:
    """The text of a content that holds text only (a system prompt, a tool result); other blocks are a 400."""
    texts = []
    for path, block in _blocks(content, where):
        if not isinstance(block, TextBlock):
            raise _unread(block, path, holder)
        texts.append(block.text)
    return "\n".join(texts)


def _tool_result(block: ToolResultBlock, where: str) -> dict[str, Any]:
    text = _texts(block.content or "", f"{where}.content", "a tool result")
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": f"Error: {text}" if block.is_error else text}


def _tool_use(block: ToolUseBlock) -> dict[str, Any]:
    arguments = orjson.dumps(block.input).decode()
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _user(content: str | list[Block], where: str) -> list[dict[str, Any]]:
    """A user turn: its tool results become `tool` messages, its text one user message, in order."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for path, block in _blocks(content, f"{where}.content"):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            out.append(_tool_result(block, path))
        else:
            raise _unread(block, path, "a user turn")
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: str | list[Block], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for path, block in _blocks(content, f"{where}.content"):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(_tool_use(block))
        elif not isinstance(block, ThinkingBlock | RedactedThinkingBlock):  # earlier thinking: dropped, as Anthropic does
            raise _unread(block, path, "an assistant turn")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(turns: list[MessageParam], system: str | None) -> list[dict[str, Any]]:
    """The turns as chat messages."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i, msg in enumerate(turns):
        where = f"messages[{i}]"
        if msg.role == "user":
            out.extend(_user(msg.content, where))
        elif msg.role == "assistant":  # a final one is a prefill: the answer continues it (translate)
            out.append(_assistant(msg.content, where))
        else:  # Claude Code's per-turn system text: a system message where it was sent
            out.append({"role": "system", "content": _texts(msg.content, f"{where}.content", "a system turn")})
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


def _tool(tool: ClientTool | ServerTool, where: str, strict: bool) -> dict[str, Any] | None:
    """A client tool as a chat function; None for one the model is not shown (under strict_params: a 400)."""
    if isinstance(tool, ServerTool):
        left_out(strict, ANTHROPIC, f"{where}.type", f"server tools ({tool.type!r}) are not available on this server.")
        return None
    if tool.defer_loading:
        # a deferred tool is outside the prompt until a tool search loads it: here there is none, so it stays out
        left_out(strict, ANTHROPIC, f"{where}.defer_loading", "there is no tool search on this server.")
        return None
    if tool.input_schema.get("type", "object") != "object":
        raise _bad(f"'{where}.input_schema.type' must be 'object'.", f"{where}.input_schema.type")
    function = {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema}
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice, chat: dict[str, Any]) -> None:
    if isinstance(choice, ToolChoiceNone):
        chat["tool_choice"] = "none"
        return
    if isinstance(choice, ToolChoiceAuto):
        chat["tool_choice"] = "auto"
    elif isinstance(choice, ToolChoiceAny):
        chat["tool_choice"] = "required"
    else:
        if choice.name not in {t["function"]["name"] for t in chat["tools"]}:
            raise _bad(f"'tool_choice.name' {choice.name!r} is not among the tools this model is shown.", "tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    if choice.disable_parallel_tool_use:
        chat["parallel_tool_calls"] = False


def _tools(req: CountTokensBody, chat: dict[str, Any], strict: bool) -> tuple[str, ...]:
    """Sets the chat tools and tool_choice; returns the names of the tools left out."""
    dropped: list[str] = []
    tools = []
    for i, t in enumerate(req.tools or ()):
        tool = _tool(t, f"tools[{i}]", strict)
        if tool is None:
            dropped.append(t.name or t.type or "")
        else:
            tools.append(tool)
    if tools:
        chat["tools"] = tools
    choice = req.tool_choice
    if choice is None:
        return tuple(dropped)
    if "tools" not in chat:
        if isinstance(choice, ToolChoiceNone) or (isinstance(choice, ToolChoiceAuto) and dropped):
            return tuple(dropped)  # auto among tools all left out: nothing to choose
        raise _bad("'tool_choice' requires 'tools'.", "tool_choice")
    _tool_choice(choice, chat)
    if "tools" in chat and names_repeat(chat["tools"]):
        raise _bad("Tool names in 'tools' must be unique.", "tools")
    return tuple(dropped)


def names_repeat(tools: list[dict[str, Any]]) -> bool:
    names = [t["function"]["name"] for t in tools]
    return len(set(names)) != len(names)


def _output_config(config: OutputConfig | None, chat: dict[str, Any]) -> None:
    if config is None or config.format is None:
        return
    if "tools" in chat and chat.get("tool_choice") != "none":
        raise _bad("'output_config.format' together with 'tools' is not supported by this server.", "output_config.format")
    schema = config.format.schema_
    chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": True}}


def _common(body: Body, chat: dict[str, Any], declared: type[_Body], strict: bool) -> tuple[_Body, str, tuple[str, ...]]:
    """What a create and a count_tokens request share: the prompt, tools, output format.

    Returns the declared request, the prefill (a final assistant message's text, "" without one) and the tools
    left out."""
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", "")
    req = declared.parse(body, strict_params=strict)
    system = _texts(req.system, "system", "the system prompt") if req.system is not None else None
    chat["messages"] = _messages(req.messages, system)
    last = chat["messages"][-1]
    prefill = last["content"] if last["role"] == "assistant" and not last.get("tool_calls") else ""
    if last["role"] == "assistant" and not prefill:
        where = f"messages[{len(req.messages) - 1}]"
        raise _bad(f"'{where}': a final assistant message must hold text to continue (a prefill).", where)
    if prefill:
        chat["continue_final_message"] = True  # the vLLM extension: the template leaves the turn open
    dropped = _tools(req, chat, strict)
    _output_config(req.output_config, chat)
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
