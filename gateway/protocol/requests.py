"""OpenAI request bodies: one declared class per endpoint (every accepted field, its type, default, bounds and
policy), and the typed requests the handlers serve (chat, completions, embeddings).

`ChatBody`, `CompletionBody` and `EmbeddingBody` are what a client may send (gateway/protocol/declared.py:
strict types, unknown fields refused, hints accepted with no effect). `parse_chat`, `parse_completion` and
`parse_embedding` add the checks between fields and build the engine's SamplingParams.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field

from backend.engine.sampling_params import SamplingParams
from gateway.errors import InvalidRequest
from gateway.protocol.declared import Declared, Expect, Hint, Int, Only, Refused
from gateway.protocol.messages import template_messages
from gateway.protocol.structured import Guided, constrain, json_schema_text
from gateway.protocol.tool_messages import with_system_text
from gateway.protocol.tools import Tool, ToolConfig, tool_config, tool_prompt

T = TypeVar("T")
NAME = r"^[a-zA-Z0-9_-]{1,64}$"
_Stop = Annotated[str | list[str], Expect("a string or an array of strings")]
_TokenIds = Annotated[list[Int], Expect("an array of integers")]
_FREE = Hint("bookkeeping: stored nowhere, no effect on the answer")


class StreamOptions(Declared):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # no obfuscation padding is ever added


class SamplingBody(Declared):
    """The sampling fields chat and completions share (OpenAI's, and vLLM's extensions)."""

    model: str
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # the access log's and the spend ledger's end user
    temperature: Annotated[float | None, Field(ge=0, le=2)] = None
    top_p: Annotated[float | None, Field(gt=0, le=1)] = None
    n: Annotated[Int | None, Field(ge=1, le=128)] = None  # the key's cap is checked later (gateway/keys/guard.py)
    stop: _Stop | None = None  # at most 16 (the engine's limit, checked by SamplingParams)
    seed: Int | None = None
    presence_penalty: Annotated[float | None, Field(ge=-2, le=2)] = None
    frequency_penalty: Annotated[float | None, Field(ge=-2, le=2)] = None
    logit_bias: Annotated[dict[str, float] | None, Expect("an object of token ids to numbers")] = None
    max_tokens: Annotated[Int | None, Field(ge=1)] = None
    # vLLM's extensions
    top_k: Annotated[Int | None, Field(ge=-1)] = None
    min_p: Annotated[float | None, Field(ge=0, le=1)] = None
    repetition_penalty: Annotated[float | None, Field(gt=0, le=2)] = None
    min_tokens: Annotated[Int | None, Field(ge=0)] = None
    ignore_eos: bool | None = None
    stop_token_ids: _TokenIds | None = None
    include_stop_str_in_output: bool | None = None
    priority: Annotated[Int | None, Field(ge=-(2**31), le=2**31 - 1)] = None  # scheduling order; the key may cap it

    def sampling(self, *, max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None
                 ) -> SamplingParams:  # fmt: skip
        """The engine's SamplingParams, whose own checks (InvalidRequestError, a 400 naming the field) cover what a
        type cannot say: logit_bias values, at most 16 stop strings."""
        return SamplingParams(
            n=_or(self.n, 1),
            max_tokens=max_tokens,
            min_tokens=_or(self.min_tokens, 0),
            temperature=_or(self.temperature, 1.0),
            top_p=_or(self.top_p, 1.0),
            top_k=_or(self.top_k, 0),
            min_p=_or(self.min_p, 0.0),
            seed=self.seed,
            presence_penalty=_or(self.presence_penalty, 0.0),
            frequency_penalty=_or(self.frequency_penalty, 0.0),
            repetition_penalty=_or(self.repetition_penalty, 1.0),
            logit_bias=_logit_bias(self.logit_bias or {}),
            stop=_stop(self.stop),
            stop_token_ids=tuple(self.stop_token_ids or ()),
            ignore_eos=bool(self.ignore_eos),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            include_stop_str_in_output=bool(self.include_stop_str_in_output),
            priority=_or(self.priority, 0),
        )

    def stream_mode(self) -> StreamMode:
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                                 param="stream_options")
        return StreamMode(bool(self.stream), bool(self.stream_options and self.stream_options.include_usage))


class JsonSchemaFormat(Declared):
    name: Annotated[str, Field(pattern=NAME)]
    schema_: Annotated[dict[str, Any], Field(alias="schema", default_factory=dict)]
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Declared):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def guided(self) -> Guided:
        if self.type == "json_object":
            return Guided(json_object=True)
        if self.type == "json_schema":
            if self.json_schema is None:
                raise InvalidRequest("Missing required parameter: 'response_format.json_schema'.",
                                     param="response_format.json_schema")
            return Guided(json_schema=json_schema_text(self.json_schema.schema_))
        return Guided()


class FunctionDefinition(Declared):
    name: Annotated[str, Field(pattern=NAME)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # a call is always constrained to the parameters' schema, strict or not


class ChatTool(Declared):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Declared):
    name: str


class NamedToolChoice(Declared):
    type: Literal["function"]
    function: FunctionName


_ToolChoice = Annotated[
    Literal["none", "auto", "required"] | NamedToolChoice,
    Expect("'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}"),
]


class ChatBody(SamplingBody):
    """POST /v1/chat/completions: every field a client may send."""

    messages: Annotated[list[dict[str, Any]], Field(min_length=1)]  # each checked by gateway/protocol/messages.py
    max_completion_tokens: Annotated[Int | None, Field(ge=1)] = None
    logprobs: bool | None = None
    top_logprobs: Annotated[Int | None, Field(ge=0, le=20)] = None
    response_format: ResponseFormat | None = None
    tools: Annotated[list[ChatTool] | None, Field(min_length=1)] = None
    tool_choice: _ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None  # the router's prefix-affinity key (gateway/routing/)
    continue_final_message: bool | None = None  # vLLM's: the answer continues the final assistant message
    function_call: Annotated[Literal["none", "auto"] | None, Only("function calling is not available yet.")] = None
    modalities: Annotated[list[Literal["text"]] | None, Only("this model produces text only.")] = None
    store: Annotated[Literal[False] | None, Only("stored completions are not available.")] = None
    metadata: Annotated[dict[str, str] | None, _FREE] = None
    safety_identifier: Annotated[str | None, _FREE] = None
    service_tier: Annotated[str | None, Hint("one tier here")] = None
    functions: Annotated[Any, Refused("function calling is not available yet.")] = None
    audio: Annotated[Any, Refused("this model produces text only.")] = None
    prediction: Annotated[Any, Refused("predicted outputs are not available.")] = None
    web_search_options: Annotated[Any, Refused("web search is not available.")] = None
    reasoning_effort: Annotated[Any, Refused("this model is not a reasoning model.")] = None
    verbosity: Annotated[Any, Refused("this model has no verbosity control.")] = None
    moderation: Annotated[Any, Refused("moderation is not available.")] = None


class CompletionBody(SamplingBody):
    """POST /v1/completions: every field a client may send."""

    prompt: Annotated[
        str | list[str] | list[list[Int]] | list[Int],
        Expect("a string, an array of strings, an array of token ids or an array of such arrays"),
    ]
    echo: bool | None = None
    logprobs: Annotated[Int | None, Field(ge=0, le=20)] = None
    suffix: Annotated[Literal[""] | None, Only("this model has no fill-in-the-middle mode.")] = None
    best_of: Annotated[Int | None, Field(ge=1)] = None


class EmbeddingBody(Declared):
    """POST /v1/embeddings: every field a client may send."""

    model: str
    input: Annotated[str | list[str] | list[list[Int]] | list[Int], Expect("a non-empty string or array of strings")]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[Int | None, Field(ge=1)] = None
    user: str | None = None


@dataclass(frozen=True)
class StreamMode:
    stream: bool
    include_usage: bool


Prompt = str | list[int]


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    params: SamplingParams
    stream: StreamMode
    logprobs: bool
    user: str | None = None
    tools: ToolConfig | None = None  # set when the output may hold tool calls
    continue_final: bool = False  # the prompt ends inside the final assistant message, which the answer continues


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: list[Prompt]
    params: SamplingParams
    stream: StreamMode
    echo: bool
    user: str | None = None


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: list[str]
    encoding_format: Literal["float", "base64"]
    dimensions: int | None
    user: str | None = None


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


def _stop(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return tuple(s for s in ([stop] if isinstance(stop, str) else stop) if s)


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """Token ids come as JSON object keys (strings)."""
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not re.fullmatch(r"-?\d+", key.strip()):
            raise InvalidRequest(f"Invalid key in 'logit_bias': {key!r} is not a token id.", param="logit_bias")
        out[int(key)] = float(value)
    return out


def _tools(body: ChatBody) -> ToolConfig | None:
    tools = tuple(
        Tool(t.function.name, t.function.description or "", t.function.parameters or {"type": "object", "properties": {}})
        for t in body.tools or ()
    )
    choice = body.tool_choice
    return tool_config(tools, choice if not isinstance(choice, NamedToolChoice) else choice.function.name,
                       body.parallel_tool_calls is not False)  # fmt: skip


def parse_chat(raw: dict[str, Any], *, strict_params: bool = False) -> ChatRequest:
    body = ChatBody.parse(raw, strict_params=strict_params)
    logprobs = bool(body.logprobs)
    if body.top_logprobs is not None and not logprobs:
        raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
    tools = _tools(body)
    messages = template_messages(body.messages)
    max_tokens = _or(body.max_completion_tokens, body.max_tokens)
    params = body.sampling(max_tokens=max_tokens, logprobs=(body.top_logprobs or 0) if logprobs else None)
    continue_final = bool(body.continue_final_message)
    if continue_final and messages[-1]["role"] != "assistant":
        raise InvalidRequest("'continue_final_message' needs a final assistant message.", param="continue_final_message")
    guided = body.response_format.guided() if body.response_format is not None else Guided()
    return ChatRequest(
        model=body.model,
        messages=messages if tools is None else with_system_text(messages, tool_prompt(tools)),
        params=constrain(params, guided, tools),
        stream=body.stream_mode(),
        logprobs=logprobs,
        user=body.user,
        tools=tools,
        continue_final=continue_final,
    )


def parse_completion(raw: dict[str, Any], *, strict_params: bool = False) -> CompletionRequest:
    body = CompletionBody.parse(raw, strict_params=strict_params)
    if body.best_of is not None and body.best_of != _or(body.n, 1):
        raise InvalidRequest("'best_of' other than n is not supported.", param="best_of")
    echo = bool(body.echo)
    params = body.sampling(
        max_tokens=_or(body.max_tokens, 16),  # OpenAI's documented default for completions
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if echo else None,
    )
    return CompletionRequest(
        model=body.model, prompts=_prompts(body.prompt), params=params, stream=body.stream_mode(), echo=echo,
        user=body.user,
    )  # fmt: skip


def _prompts(prompt: str | list[str] | list[list[int]] | list[int]) -> list[Prompt]:
    """A string, a list of strings, a list of token ids, or a list of lists of token ids."""
    if isinstance(prompt, str):
        return [prompt]
    if prompt and all(isinstance(p, int) for p in prompt):
        return [list(prompt)]  # type: ignore[arg-type]
    if prompt and all(isinstance(p, str) or p for p in prompt):
        return list(prompt)  # type: ignore[arg-type]
    raise InvalidRequest(
        "'prompt' must be a string, an array of strings, an array of token ids or an array of such arrays.",
        param="prompt",
    )


def parse_embedding(raw: dict[str, Any], *, strict_params: bool = False) -> EmbeddingRequest:
    body = EmbeddingBody.parse(raw, strict_params=strict_params)
    return EmbeddingRequest(
        model=body.model,
        inputs=_embedding_inputs(body.input),
        encoding_format=body.encoding_format or "float",
        dimensions=body.dimensions,
        user=body.user,
    )


def _embedding_inputs(given: str | list[str] | list[list[int]] | list[int]) -> list[str]:
    inputs = [given] if isinstance(given, str) else given
    if inputs and all(isinstance(s, str) for s in inputs):
        if not all(inputs):
            raise InvalidRequest("'input' must not contain empty strings.", param="input")
        return list(inputs)  # type: ignore[arg-type]
    if inputs:
        raise InvalidRequest(
            "Token-id input is not supported: this embedding model has its own tokenizer; send strings "
            "(with LangChain's OpenAIEmbeddings set check_embedding_ctx_length=False).",
            param="input",
        )
    raise InvalidRequest("'input' must be a non-empty string or array of strings.", param="input")
