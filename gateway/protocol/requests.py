"""OpenAI request bodies -> typed, validated requests (chat, completions, embeddings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from backend.engine.sampling_params import SamplingParams
from gateway.errors import InvalidRequest
from gateway.protocol import fields as f
from gateway.protocol.fields import Body
from gateway.protocol.messages import template_messages
from gateway.protocol.sampling import SAMPLING_KEYS, sampling_params
from gateway.protocol.structured import constrain, parse_response_format
from gateway.protocol.tool_messages import with_system_text
from gateway.protocol.tools import ToolConfig, parse_tools, tool_prompt

_COMMON_KEYS = SAMPLING_KEYS | {"model", "stream", "stream_options", "max_tokens", "user"}
_CHAT_IGNORED = {
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "store",
}
_CHAT_UNSUPPORTED = {
    "functions": "function calling is not available yet.",
    "audio": "this model produces text only.",
    "prediction": "predicted outputs are not available.",
    "web_search_options": "web search is not available.",
    "reasoning_effort": "this model is not a reasoning model.",
    "verbosity": "this model has no verbosity control.",
    "moderation": "moderation is not available.",
}
_CHAT_KEYS = _COMMON_KEYS | _CHAT_IGNORED | set(_CHAT_UNSUPPORTED) | {
    "messages", "max_completion_tokens", "logprobs", "top_logprobs", "response_format", "tool_choice",
    "function_call", "modalities", "tools", "parallel_tool_calls",
    "continue_final_message",  # vLLM's extension: the answer continues the final assistant message (a prefill)
}  # fmt: skip
_COMPLETION_KEYS = _COMMON_KEYS | {"prompt", "echo", "logprobs", "suffix", "best_of"}
_EMBEDDING_KEYS = {"model", "input", "encoding_format", "dimensions", "user"}

Prompt = str | list[int]


@dataclass(frozen=True)
class StreamOptions:
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    params: SamplingParams
    stream: StreamOptions
    logprobs: bool
    user: str | None = None
    tools: ToolConfig | None = None  # set when the output may hold tool calls
    continue_final: bool = False  # the prompt ends inside the final assistant message, which the answer continues


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: list[Prompt]
    params: SamplingParams
    stream: StreamOptions
    echo: bool
    user: str | None = None


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[str]
    encoding_format: Literal["float", "base64"]
    dimensions: int | None
    user: str | None = None


def _stream_options(body: Body) -> StreamOptions:
    stream = bool(f.opt_bool(body, "stream"))
    opts = f.opt_object(body, "stream_options")
    if opts is not None and not stream:
        raise InvalidRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options")
    opts = opts or {}
    f.reject_unknown(opts, {"include_usage", "include_obfuscation"})
    include = f.opt_bool(opts, "include_usage", param="stream_options.include_usage")
    return StreamOptions(stream=stream, include_usage=bool(include))


def _check_choice(body: Body, key: str, allowed: tuple[object, ...], why: str) -> None:
    value = body.get(key)
    if value is not None and value not in allowed:
        raise InvalidRequest(f"'{key}' value {value!r} is not supported: {why}", param=key)


def parse_chat(body: Body) -> ChatRequest:
    f.reject_unknown(body, _CHAT_KEYS)
    f.reject_unsupported(body, _CHAT_UNSUPPORTED)
    _check_choice(body, "function_call", ("none", "auto"), "function calling is not available yet.")
    _check_choice(body, "modalities", (["text"],), "this model produces text only.")
    _check_choice(body, "store", (False,), "stored completions are not available.")
    logprobs = bool(f.opt_bool(body, "logprobs"))
    top = f.opt_int(body, "top_logprobs", lo=0, hi=20)
    if top is not None and not logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    max_tokens = f.opt_int(body, "max_completion_tokens")
    max_tokens = max_tokens if max_tokens is not None else f.opt_int(body, "max_tokens")
    tools = parse_tools(body)
    messages = template_messages(body.get("messages"))
    params = sampling_params(body, max_tokens=max_tokens, logprobs=(top or 0) if logprobs else None)
    continue_final = bool(f.opt_bool(body, "continue_final_message"))
    if continue_final and messages[-1]["role"] != "assistant":
        raise InvalidRequest("'continue_final_message' needs a final assistant message.", param="continue_final_message")
    return ChatRequest(
        model=f.req_str(body, "model"),
        messages=messages if tools is None else with_system_text(messages, tool_prompt(tools)),
        params=constrain(params, parse_response_format(body), tools),
        stream=_stream_options(body),
        logprobs=logprobs,
        user=f.opt_str(body, "user"),
        tools=tools,
        continue_final=continue_final,
    )


def parse_completion(body: Body) -> CompletionRequest:
    f.reject_unknown(body, _COMPLETION_KEYS)
    if body.get("suffix"):
        raise InvalidRequest("'suffix' is not supported: this model has no fill-in-the-middle mode.", param="suffix")
    best_of = f.opt_int(body, "best_of")
    if best_of is not None and best_of != (f.opt_int(body, "n") or 1):
        raise InvalidRequest("'best_of' other than n is not supported.", param="best_of")
    echo = bool(f.opt_bool(body, "echo"))
    logprobs = f.opt_int(body, "logprobs", lo=0, hi=20)
    max_tokens = f.opt_int(body, "max_tokens")
    params = sampling_params(
        body,
        max_tokens=16 if max_tokens is None else max_tokens,  # OpenAI's documented default for completions
        logprobs=logprobs,
        prompt_logprobs=logprobs if echo else None,
    )
    return CompletionRequest(
        model=f.req_str(body, "model"),
        prompts=_prompts(body.get("prompt")),
        params=params,
        stream=_stream_options(body),
        echo=echo,
        user=f.opt_str(body, "user"),
    )


def _is_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _prompts(raw: object) -> list[Prompt]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if _is_ids(raw):
            return [list(raw)]
        if all(isinstance(p, str) for p in raw):
            return list(raw)
        if all(_is_ids(p) and p for p in raw):
            return [list(p) for p in raw]
    if raw is None:
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt")
    raise InvalidRequest(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays.",
        param="prompt",
    )


def parse_embedding(body: Body) -> EmbeddingRequest:
    f.reject_unknown(body, _EMBEDDING_KEYS)
    fmt = f.opt_str(body, "encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise InvalidRequest("'encoding_format' must be 'float' or 'base64'.", param="encoding_format")
    return EmbeddingRequest(
        model=f.req_str(body, "model"),
        inputs=_embedding_inputs(body.get("input")),
        encoding_format="base64" if fmt == "base64" else "float",
        dimensions=f.opt_int(body, "dimensions", lo=1),
        user=f.opt_str(body, "user"),
    )


def _embedding_inputs(raw: object) -> list[str]:
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, list) and raw and all(isinstance(s, str) for s in raw):
        if not all(raw):
            raise InvalidRequest("'input' must not contain empty strings.", param="input")
        return list(raw)
    if isinstance(raw, list) and raw and (_is_ids(raw) or all(_is_ids(p) for p in raw)):
        raise InvalidRequest(
            "Token-id input is not supported: this embedding model has its own tokenizer; send strings "
            "(with LangChain's OpenAIEmbeddings set check_embedding_ctx_length=False).",
            param="input",
        )
    raise InvalidRequest("'input' must be a non-empty string or array of strings.", param="input")
