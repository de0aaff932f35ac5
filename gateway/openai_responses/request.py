"""A /v1/responses body -> a validated ResponsesRequest, and that request -> a chat-completions body.

Everything the gateway cannot honour is a 400 that names the field: built-in tools (web search, file
search, code interpreter, computer use...), reasoning options (the model does not reason), background
mode, conversations, prompt templates, media inputs. Fields that change nothing here (service_tier,
prompt_cache_key, safety_identifier...) are accepted and echoed like OpenAI does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import Field

from gateway.errors import InvalidRequest
from gateway.openai_responses.items import NewId, parse_input
from gateway.protocol import fields as f
from gateway.protocol.declared import OPENAI, Declared, Hint, Int, Only, Refused, left_out
from gateway.protocol.fields import Body

_NO_REASONING = "this model is not a reasoning model: it answers without reasoning, and returns no reasoning items"


def _no_reasoning_asked(value: Any) -> bool:
    return isinstance(value, dict) and value.get("effort") in (None, "none") and value.get("summary") is None \
        and value.get("generate_summary") is None  # fmt: skip


class TextParam(Declared):
    format: dict[str, Any] | None = None  # text, json_object or json_schema (_format)
    verbosity: Annotated[Any, Hint("this model has no verbosity control", neutral=lambda v: v == "medium")] = None


class StreamOptionsParam(Declared):
    include_obfuscation: bool | None = None  # no obfuscation padding is ever added


class ResponsesBody(Declared):
    """POST /v1/responses (and /v1/responses/input_tokens): every field a client may send. The items of `input`,
    `tools` and `tool_choice` are read by gateway/openai_responses/items.py and the functions below."""

    model: str | None = None  # required to create a response (parse_request), not to count its tokens
    input: str | list[Any] | None = None
    instructions: str | None = None
    max_output_tokens: Int | None = None  # at least 16, as OpenAI's (parse_request)
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    text: TextParam | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    metadata: Any = None  # at most 16 string pairs (_metadata)
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
    reasoning: Annotated[Any, Hint(_NO_REASONING, neutral=_no_reasoning_asked)] = None
    client_metadata: Annotated[Any, Hint("not stored or logged: `metadata` is what a response keeps")] = None
    prompt_cache_retention: Annotated[Any, Hint("the prefix cache keeps prefixes while memory allows, whatever the "
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


# Tools this server cannot run: left out of what the model sees (under strict_params, refused)
_BUILTIN_TOOLS = {
    "web_search": "web search", "web_search_preview": "web search", "web_search_preview_2025_03_11": "web search",
    "web_search_2025_08_26": "web search", "file_search": "file search", "code_interpreter": "the code interpreter",
    "computer": "computer use", "computer_use": "computer use", "computer_use_preview": "computer use",
    "image_generation": "image generation", "local_shell": "the local shell", "shell": "the shell", "mcp": "MCP servers",
    "apply_patch": "apply_patch", "custom": "custom (free-form grammar) tools", "tool_search": "tool search",
}  # fmt: skip
_INCLUDE_HINTS = {"reasoning.encrypted_content"}  # no reasoning items to include
_FUNCTION_KEYS = {"type", "name", "description", "parameters", "strict"}
_INCLUDE_OK = {"message.output_text.logprobs"}
_FORMAT_KEYS = {"type", "name", "schema", "strict", "description"}


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
    ResponsesBody.parse(body, strict_params=strict)
    _check_reasoning(body.get("reasoning"))
    top_logprobs = _logprobs(body, strict)
    stream = bool(f.opt_bool(body, "stream"))
    opts = f.opt_object(body, "stream_options")
    if opts is not None:
        if not stream:
            raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.", param="stream_options")
        f.reject_unknown(opts, {"include_obfuscation"})
    truncation = f.opt_str(body, "truncation") or "disabled"
    if truncation not in ("auto", "disabled"):
        raise InvalidRequest(
            f"Invalid value for 'truncation': {truncation!r}; expected 'auto' or 'disabled'.", param="truncation"
        )
    max_out = f.opt_int(body, "max_output_tokens")
    if max_out is not None and max_out < 16:
        raise InvalidRequest(
            f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= 16, but got {max_out} instead.",
            param="max_output_tokens",
        )
    tools, left = _tools(body.get("tools"), strict)
    model = f.opt_str(body, "model") if counting else f.req_str(body, "model")
    previous = f.opt_str(body, "previous_response_id")
    raw_input = body.get("input")
    if raw_input is None and not counting:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    return ResponsesRequest(
        model=model or "",
        input=parse_input(raw_input, new_id) if raw_input is not None else [],
        instructions=f.opt_str(body, "instructions"),
        stream=stream,
        store=f.opt_bool(body, "store") is not False,
        previous_response_id=previous,
        truncation=truncation,
        max_output_tokens=max_out,
        temperature=f.opt_float(body, "temperature"),
        top_p=f.opt_float(body, "top_p"),
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        parallel_tool_calls=f.opt_bool(body, "parallel_tool_calls") is not False,
        text=_text(body.get("text")),
        metadata=_metadata(body.get("metadata")),
        user=f.opt_str(body, "user"),
        top_logprobs=top_logprobs,
        echo={
            "service_tier": _service_tier(body),
            "safety_identifier": f.opt_str(body, "safety_identifier"),
            "prompt_cache_key": f.opt_str(body, "prompt_cache_key"),
            "max_tool_calls": f.opt_int(body, "max_tool_calls", lo=1),
        },
        extensions={k: body[k] for k in ("seed", "priority", "cache") if body.get(k) is not None},
        left_out=left,
    )


def _check_reasoning(raw: object) -> None:
    """Any reasoning setting is served without reasoning (a hint: _FIELDS), but it must be an object."""
    if raw is not None and not isinstance(raw, dict):
        raise InvalidRequest("Invalid type for 'reasoning': expected an object.", param="reasoning")


def _logprobs(body: Body, strict: bool) -> int | None:
    include = body.get("include")
    if include is not None and (not isinstance(include, list) or not all(isinstance(v, str) for v in include)):
        raise InvalidRequest("Invalid type for 'include': expected an array of strings.", param="include")
    for value in include or ():
        if value in _INCLUDE_HINTS and not strict:
            continue
        if value not in _INCLUDE_OK:
            raise InvalidRequest(
                f"'include' value {value!r} is not supported: this server only adds 'message.output_text.logprobs'.",
                param="include",
            )
    top = f.opt_int(body, "top_logprobs", lo=0, hi=20)
    if "message.output_text.logprobs" in (include or ()):
        return top or 0
    return None


def _service_tier(body: Body) -> str:
    tier = f.opt_str(body, "service_tier")
    if tier not in (None, "auto", "default"):
        raise InvalidRequest(
            f"'service_tier' {tier!r} is not supported: this server has one tier ('default').", param="service_tier"
        )
    return "default"


def _tools(raw: object, strict: bool) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The function tools the model is shown (a namespace's ones by their names), and the names of those left out."""
    if raw is None:
        return [], ()
    if not isinstance(raw, list):
        raise InvalidRequest("Invalid type for 'tools': expected an array of tool objects.", param="tools")
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(raw):
        _collect(f"tools[{i}]", tool, strict, out, dropped=dropped)
    names = [t["name"] for t in out]
    if len(set(names)) != len(names):
        raise InvalidRequest("Tool names in 'tools' must be unique.", param="tools")
    return out, tuple(dropped)


def _collect(where: str, tool: object, strict: bool, out: list[dict[str, Any]], *, dropped: list[str]) -> None:
    if not isinstance(tool, dict):
        raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param=where)
    kind = tool.get("type")
    if kind == "namespace":  # a group of tools (an MCP server's, say): its function tools are offered by name
        members = tool.get("tools")
        if not isinstance(members, list):
            raise InvalidRequest(f"Invalid type for '{where}.tools': expected an array of tools.", param=f"{where}.tools")
        for j, member in enumerate(members):
            _collect(f"{where}.tools[{j}]", member, strict, out, dropped=dropped)
    elif isinstance(kind, str) and kind in _BUILTIN_TOOLS:
        why = f"this server cannot run {_BUILTIN_TOOLS[kind]}; only 'function' tools are supported."
        left_out(strict, OPENAI, f"{where}.type", why)
        dropped.append(str(tool.get("name") or kind))
    else:
        out.append(_tool(where, tool))


def _tool(where: str, tool: dict[str, Any]) -> dict[str, Any]:
    kind = tool.get("type")
    if kind != "function":
        raise InvalidRequest(
            f"Invalid value for '{where}.type': {kind!r}; only 'function' tools are supported.", param=f"{where}.type"
        )
    for key in tool:
        if key not in _FUNCTION_KEYS:
            raise InvalidRequest(f"Unknown parameter: '{where}.{key}'.", param=f"{where}.{key}")
    name = f.req_str(tool, "name", param=f"{where}.name")
    params = tool.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise InvalidRequest(
            f"Invalid type for '{where}.parameters': expected a JSON schema object.", param=f"{where}.parameters"
        )
    strict = f.opt_bool(tool, "strict", param=f"{where}.strict")
    return {
        "type": "function",
        "name": name,
        "description": f.opt_str(tool, "description", param=f"{where}.description"),
        "parameters": params if params is not None else {"type": "object", "properties": {}},
        "strict": strict is not False,
    }


def _tool_choice(raw: object, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    names = {t["name"] for t in tools}
    if raw is None:
        return "auto"
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise InvalidRequest("'tool_choice' 'required' needs at least one tool in 'tools'.", param="tool_choice")
        return raw
    if not isinstance(raw, dict):
        raise InvalidRequest(
            "Invalid value for 'tool_choice': expected 'none', 'auto', 'required' or an object.", param="tool_choice"
        )
    kind = raw.get("type")
    if kind == "function":
        name = raw.get("name")
        if name not in names:
            raise InvalidRequest(f"'tool_choice' names function {name!r}, which is not in 'tools'.", param="tool_choice.name")
        return {"type": "function", "name": name}
    if kind == "allowed_tools":
        mode = raw.get("mode")
        allowed = raw.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list) or not allowed:
            raise InvalidRequest(
                "'tool_choice' allowed_tools needs 'mode' ('auto' or 'required') and a non-empty 'tools'.", param="tool_choice"
            )
        for j, t in enumerate(allowed):
            if not isinstance(t, dict) or t.get("type") != "function" or t.get("name") not in names:
                raise InvalidRequest(
                    f"'tool_choice.tools[{j}]' must name a function in 'tools'.", param=f"tool_choice.tools[{j}]"
                )
        return {"type": "allowed_tools", "mode": mode, "tools": [{"type": "function", "name": t["name"]} for t in allowed]}
    if isinstance(kind, str) and kind in _BUILTIN_TOOLS:
        raise InvalidRequest(
            f"'tool_choice' type '{kind}' is not supported: this server cannot run {_BUILTIN_TOOLS[kind]}.",
            param="tool_choice.type",
        )
    raise InvalidRequest(f"Invalid value for 'tool_choice.type': {kind!r}.", param="tool_choice.type")


def _text(raw: object) -> dict[str, Any]:
    """`text`; its fields were checked by TextParam (verbosity is a hint, echoed as sent)."""
    if raw is None:
        return {"format": {"type": "text"}, "verbosity": "medium"}
    if not isinstance(raw, dict):
        raise InvalidRequest("Invalid type for 'text': expected an object.", param="text")
    verbosity = raw.get("verbosity") or "medium"
    if verbosity not in ("low", "medium", "high"):
        raise InvalidRequest(
            f"Invalid value for 'text.verbosity': {verbosity!r}; expected 'low', 'medium' or 'high'.", param="text.verbosity"
        )
    return {"format": _format(raw.get("format")), "verbosity": verbosity}


def _format(raw: object) -> dict[str, Any]:
    if raw is None:
        return {"type": "text"}
    if not isinstance(raw, dict):
        raise InvalidRequest("Invalid type for 'text.format': expected an object.", param="text.format")
    kind = raw.get("type")
    if kind in ("text", "json_object"):
        extra = set(raw) - {"type"}
        if extra:
            raise InvalidRequest(f"Unknown parameter: 'text.format.{sorted(extra)[0]}'.", param=f"text.format.{sorted(extra)[0]}")
        return {"type": kind}
    if kind != "json_schema":
        raise InvalidRequest(
            f"Invalid value for 'text.format.type': {kind!r}; expected 'text', 'json_object' or 'json_schema'.",
            param="text.format.type",
        )
    for key in raw:
        if key not in _FORMAT_KEYS:
            raise InvalidRequest(f"Unknown parameter: 'text.format.{key}'.", param=f"text.format.{key}")
    name = f.req_str(raw, "name", param="text.format.name")
    schema = raw.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequest(
            "Missing required parameter: 'text.format.schema' (a JSON schema object).", param="text.format.schema"
        )
    out: dict[str, Any] = {"type": "json_schema", "name": name, "schema": schema}
    out["strict"] = bool(f.opt_bool(raw, "strict", param="text.format.strict"))
    description = f.opt_str(raw, "description", param="text.format.description")
    if description is not None:
        out["description"] = description
    return out


def _metadata(raw: object) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequest("Invalid type for 'metadata': expected an object.", param="metadata")
    if len(raw) > 16:
        raise InvalidRequest("Invalid 'metadata': at most 16 key-value pairs are allowed.", param="metadata")
    for key, value in raw.items():
        if len(key) > 64:
            raise InvalidRequest(f"Invalid 'metadata': key {key[:20]!r}... is longer than 64 characters.", param="metadata")
        if not isinstance(value, str) or len(value) > 512:
            raise InvalidRequest(
                f"Invalid 'metadata.{key}': values must be strings of at most 512 characters.", param=f"metadata.{key}"
            )
    return dict(raw)


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
