"""A /v1/responses body -> a validated ResponsesRequest, and that request -> a chat-completions body.

The body is declared (ResponsesBody here, the objects inside it in params.py). Everything the gateway cannot
honour is a 400 that names the field: a built-in tool in tool_choice, background mode, conversations, prompt
templates, media inputs, reasoning items; built-in tools themselves are left out of what the model sees.
Fields that change nothing here (reasoning, service_tier, prompt_cache_key, safety_identifier...) are
accepted, and echoed like OpenAI does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from gateway.errors import InvalidRequest
from gateway.openai_responses.items import NewId, parse_input
from gateway.openai_responses.params import (
    BUILTIN_TOOLS,
    AllowedTools,
    BuiltinTool,
    Format,
    FunctionChoice,
    FunctionTool,
    Item,
    JsonSchemaFormat,
    NamespaceTool,
    Reasoning,
    Tool,
    ToolChoice,
)
from gateway.protocol.declared import OPENAI, Declared, Hint, Int, Only, Refused, left_out
from gateway.protocol.fields import Body

_NO_REASONING = "this model is not a reasoning model: it answers without reasoning, and returns no reasoning items"


def _no_reasoning_asked(value: Reasoning) -> bool:
    return value.effort in (None, "none") and value.summary is None and value.generate_summary is None


class TextParam(Declared):
    format: Format | None = None  # text, json_object or json_schema (_format)
    verbosity: Annotated[Literal["low", "medium", "high"] | None,
                         Hint("this model has no verbosity control", neutral=lambda v: v == "medium")] = None  # fmt: skip


class StreamOptionsParam(Declared):
    include_obfuscation: bool | None = None  # no obfuscation padding is ever added


_Metadata = Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)]


class ResponsesBody(Declared):
    """POST /v1/responses (and /v1/responses/input_tokens): every field a client may send; the items of `input`,
    `tools` and `tool_choice` are declared in params.py."""

    model: str | None = None  # required to create a response (parse_request), not to count its tokens
    input: str | list[Item] | None = None  # required to create a response (parse_request)
    instructions: str | None = None
    max_output_tokens: Int | None = None  # at least 16, as OpenAI's (parse_request)
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    text: TextParam | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    metadata: _Metadata | None = None  # at most 16 pairs; keys of at most 64 characters (_metadata)
    user: str | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream: bool | None = None
    stream_options: StreamOptionsParam | None = None
    include: list[str] | None = None
    top_logprobs: Annotated[Int | None, Field(ge=0, le=20)] = None
    service_tier: str | None = None  # echoed; only "auto" and "default" (_service_tier)
    safety_identifier: str | None = None  # echoed
    max_tool_calls: Annotated[Int | None, Field(ge=1)] = None  # echoed
    background: Annotated[Literal[False] | None, Only("responses are generated while the request waits.")] = None
    prompt_cache_key: str | None = None  # the prefix-affinity key across replicas (gateway/routing/router.py)
    reasoning: Annotated[Reasoning | None, Hint(_NO_REASONING, neutral=_no_reasoning_asked)] = None
    client_metadata: Annotated[Any, Hint("not stored or logged: `metadata` is what a response keeps")] = None
    prompt_cache_retention: Annotated[str | None, Hint("the prefix cache keeps prefixes while memory allows, whatever the "
                                                "retention")] = None  # fmt: skip
    prompt_cache_options: Annotated[Any, Hint("the prefix cache needs no options")] = None
    # the gateway's extensions, as on /v1/chat/completions
    seed: Int | None = None
    priority: Int | None = None
    cache: Any = None
    conversation: Annotated[Any, Refused("conversations are not available: continue with previous_response_id.")] = None
    prompt: Annotated[Any, Refused("stored prompt templates are not available: send instructions and input.")] = None
    context_management: Annotated[Any, Refused("context management (compaction) is not available.")] = None
    moderation: Annotated[Any, Refused("moderation is not available.")] = None
    personality: Annotated[Any, Refused("this model has no personality presets.")] = None


_INCLUDE_HINTS = {"reasoning.encrypted_content"}  # no reasoning items to include
_INCLUDE_OK = {"message.output_text.logprobs"}


@dataclass(frozen=True)
class ResponsesRequest:
    model: str
    input: list[dict[str, Any]]  # this request's input items, with ids
    instructions: str | None
    stream: bool
    store: bool
    previous_response_id: str | None
    truncation: str  # auto | disabled
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    tools: list[dict[str, Any]]  # echoed function tools
    tool_choice: str | dict[str, Any]
    parallel_tool_calls: bool
    text: dict[str, Any]  # echoed {"format": ..., "verbosity": ...}
    metadata: dict[str, str]
    user: str | None
    top_logprobs: int | None  # set when `include` asks for message.output_text.logprobs
    echo: dict[str, Any] = field(default_factory=dict)  # fields returned as sent (service_tier, prompt_cache_key...)
    extensions: dict[str, Any] = field(default_factory=dict)  # seed, priority, cache: passed to the chat pipeline
    left_out: tuple[str, ...] = ()  # tools the model was not shown (built-in tools this server cannot run)


def parse_request(body: Body, new_id: NewId, *, counting: bool = False, strict: bool = False) -> ResponsesRequest:
    """`counting`: POST /v1/responses/input_tokens (no model needed, nothing generated). `strict`: strict_params."""
    req = ResponsesBody.parse(body, strict_params=strict)
    top_logprobs = _logprobs(req, strict)
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
    max_out = req.max_output_tokens
    if max_out is not None and max_out < 16:
        raise InvalidRequest(
            f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {max_out} instead.",
            param="max_output_tokens",
        )
    tools, left = _tools(req.tools or [], strict)
    if not counting and req.model is None:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    if req.input is None and not counting:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    return ResponsesRequest(
        model=req.model or "",
        input=parse_input(req.input, new_id) if req.input is not None else [],
        instructions=req.instructions,
        stream=bool(req.stream),
        store=req.store is not False,
        previous_response_id=req.previous_response_id,
        truncation=req.truncation or "disabled",
        max_output_tokens=max_out,
        temperature=req.temperature,
        top_p=req.top_p,
        tools=tools,
        tool_choice=_tool_choice(req.tool_choice, tools),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        text=_text(req.text),
        metadata=_metadata(req.metadata),
        user=req.user,
        top_logprobs=top_logprobs,
        echo={
            "service_tier": _service_tier(req.service_tier),
            "safety_identifier": req.safety_identifier,
            "prompt_cache_key": req.prompt_cache_key,
            "max_tool_calls": req.max_tool_calls,
        },
        extensions={k: getattr(req, k) for k in ("seed", "priority", "cache") if getattr(req, k) is not None},
        left_out=left,
    )


def _logprobs(req: ResponsesBody, strict: bool) -> int | None:
    for value in req.include or ():
        if value in _INCLUDE_HINTS and not strict:
            continue
        if value not in _INCLUDE_OK:
            raise InvalidRequest(
                f"'include' value {value!r} is not supported: this server only adds 'message.output_text.logprobs'.",
                param="include",
            )
    if "message.output_text.logprobs" in (req.include or ()):
        return req.top_logprobs or 0
    return None


def _service_tier(tier: str | None) -> str:
    if tier not in (None, "auto", "default"):
        raise InvalidRequest(
            f"'service_tier' {tier!r} is not supported: this server has one tier ('default').", param="service_tier"
        )
    return "default"


def _tools(given: list[Tool], strict: bool) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The function tools the model is shown (a namespace's ones by their names), and the names of those left out."""
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(given):
        where = f"tools[{i}]"
        members = [(f"{where}.tools[{j}]", t) for j, t in enumerate(tool.tools)] if isinstance(tool, NamespaceTool) \
            else [(where, tool)]  # fmt: skip
        for path, member in members:
            if isinstance(member, BuiltinTool):
                why = f"this server cannot run {BUILTIN_TOOLS[member.type]}; only 'function' tools are supported."
                left_out(strict, OPENAI, f"{path}.type", why)
                dropped.append(member.name or member.type)
            else:
                out.append(_function(member))
    names = [t["name"] for t in out]
    if len(set(names)) != len(names):
        raise InvalidRequest("Tool names in 'tools' must be unique.", param="tools")
    return out, tuple(dropped)


def _function(tool: FunctionTool) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}},
        "strict": tool.strict is not False,
    }


def _tool_choice(choice: ToolChoice | None, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    """The choice as echoed (a built-in tool's was refused by BuiltinChoice)."""
    names = {t["name"] for t in tools}
    if choice is None:
        return "auto"
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs at least one tool in 'tools'.", param="tool_choice")
        return choice
    if isinstance(choice, FunctionChoice):
        if choice.name not in names:
            raise InvalidRequest(f"'tool_choice' names function {choice.name!r}, which is not in 'tools'.",
                                 param="tool_choice.name")  # fmt: skip
        return {"type": "function", "name": choice.name}
    assert isinstance(choice, AllowedTools)  # the built-in choice is refused when parsed
    for j, t in enumerate(choice.tools):
        if t.name not in names:
            raise InvalidRequest(f"'tool_choice.tools[{j}]' must name a function in 'tools'.", param=f"tool_choice.tools[{j}]")
    return {"type": "allowed_tools", "mode": choice.mode, "tools": [{"type": "function", "name": t.name} for t in choice.tools]}


def _text(text: TextParam | None) -> dict[str, Any]:
    """`text` as echoed (verbosity is a hint, echoed as sent)."""
    if text is None:
        return {"format": {"type": "text"}, "verbosity": "medium"}
    return {"format": _format(text.format), "verbosity": text.verbosity or "medium"}


def _format(fmt: Format | None) -> dict[str, Any]:
    if fmt is None:
        return {"type": "text"}
    if not isinstance(fmt, JsonSchemaFormat):
        return {"type": fmt.type}
    out: dict[str, Any] = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema_, "strict": bool(fmt.strict)}
    if fmt.description is not None:
        out["description"] = fmt.description
    return out


def _metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    for key in metadata or {}:
        if len(key) > 64:
            raise InvalidRequest(f"Invalid 'metadata': key {key[:20]!r}... is longer than 64 characters.", param="metadata")
    return dict(metadata or {})


def chat_body(req: ResponsesRequest, messages: list[dict[str, Any]], model: str) -> dict[str, Any]:
    """The chat-completions body the pipeline runs (instructions first, as the system message)."""
    if req.instructions:
        messages = [{"role": "system", "content": req.instructions}, *messages]
    body: dict[str, Any] = {"model": model, "messages": messages, **req.extensions}
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    optional = {
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "user": req.user,
        "prompt_cache_key": req.echo.get("prompt_cache_key"),  # the router's prefix-affinity key
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if req.top_logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs
    fmt = req.text["format"]
    if fmt["type"] == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt["type"] == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    _chat_tools(req, body)
    return body


def _chat_tools(req: ResponsesRequest, body: dict[str, Any]) -> None:
    choice = req.tool_choice
    tools = req.tools
    if not tools or choice == "none":
        return
    if isinstance(choice, dict) and choice["type"] == "allowed_tools":
        allowed = {t["name"] for t in choice["tools"]}
        tools = [t for t in tools if t["name"] in allowed]
        choice = choice["mode"]
    body["tools"] = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"] or "", "parameters": t["parameters"]},
        }
        for t in tools
    ]
    if isinstance(choice, dict):
        body["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        body["tool_choice"] = choice
    body["parallel_tool_calls"] = req.parallel_tool_calls


def echo_fields(req: ResponsesRequest) -> Mapping[str, Any]:
    """The request's settings as a Response object repeats them."""
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "previous_response_id": req.previous_response_id,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "tools": req.tools,
        "tool_choice": req.tool_choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        "text": req.text,
        "metadata": req.metadata,
        **({"user": req.user} if req.user is not None else {}),  # a string when present (never null)
        "store": req.store,
        "truncation": req.truncation,
        "top_logprobs": req.top_logprobs or 0,
        "reasoning": {"effort": None, "summary": None},
        "background": False,
        **req.echo,
    }
