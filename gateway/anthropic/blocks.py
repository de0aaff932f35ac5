"""The objects inside a Messages request, declared (gateway/protocol/declared.py): content blocks, system text
blocks, client and server tools, tool_choice, the output format.

Content blocks are told apart by their `type` (`tagged`): an error inside one names its path
(`messages[0].content[1].text: Input should be a valid string`). Which blocks a turn may hold is the
translation's business (request.py): text everywhere; tool_use, thinking and redacted_thinking in assistant
turns; tool_result in user turns. Blocks this server cannot read (images, documents, server tool results...)
are refused by their type, whatever else they hold: a client learns what is not supported, not which of their
fields it got wrong. `cache_control` is accepted on every block and tool, as Anthropic accepts it, and changes
nothing: the prefix cache finds shared prefixes by itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gateway.protocol.declared import ANTHROPIC, Declared, Hint, Int, Only, tagged

NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # the chat pipeline's limit (gateway/protocol/tools.py)
_Id = Annotated[str, Field(min_length=1)]


def _always(value: object) -> bool:
    return True


class AnthropicDeclared(Declared):
    wording = ANTHROPIC


class CacheControl(AnthropicDeclared):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


# a breakpoint asks for nothing an answer shows: kept under strict_params too
_Cache = Annotated[CacheControl | None, Hint("the prefix cache reuses every shared prompt prefix by itself "
                                             "(no breakpoints needed)", neutral=_always)]  # fmt: skip


class TextBlock(AnthropicDeclared):
    type: Literal["text"]
    text: str
    cache_control: _Cache = None
    citations: Annotated[Annotated[list[None], Field(max_length=0)] | None,
                         Only("this server does not cite documents.")] = None  # fmt: skip


class ToolUseBlock(AnthropicDeclared):
    """An earlier call of a client tool (assistant turns)."""

    type: Literal["tool_use"]
    id: _Id
    name: _Id
    input: dict[str, Any] = Field(default_factory=dict)  # the call's arguments: any JSON object
    cache_control: _Cache = None
    caller: Annotated[dict[str, str] | None, Hint("who made the call (programmatic tool calling): the model sees the "
                                                  "call alike", neutral=_always)] = None  # fmt: skip


# every block type Anthropic defines that this server cannot read, and why
UNREAD = {
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


class UnreadBlock(AnthropicDeclared):
    """A block this server cannot read (UNREAD): its type is refused by the translation, its other fields unread."""

    model_config = ConfigDict(extra="allow")
    type: Literal[tuple(UNREAD)]  # type: ignore[valid-type]  # a tuple of strings: one Literal of each


if TYPE_CHECKING:  # what mypy sees; pydantic validates the tagged union
    ResultBlock = TextBlock | UnreadBlock
else:
    ResultBlock = tagged(TextBlock, UnreadBlock)


class ToolResultBlock(AnthropicDeclared):
    """A client tool's result (user turns): text, or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: _Id
    content: str | list[ResultBlock] | None = None
    is_error: bool | None = None
    cache_control: _Cache = None


class ThinkingBlock(AnthropicDeclared):
    """An earlier turn's thinking (assistant turns): dropped, as Anthropic drops it."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None
    cache_control: _Cache = None


class RedactedThinkingBlock(AnthropicDeclared):
    type: Literal["redacted_thinking"]
    data: str
    cache_control: _Cache = None


if TYPE_CHECKING:
    Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock | UnreadBlock
else:
    Block = tagged(TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock, UnreadBlock)


class ClientTool(AnthropicDeclared):
    """A tool the client runs: a chat function (request.py); `defer_loading` ones stay out of the prompt."""

    type: Literal["custom"] | None = None
    name: Annotated[str, Field(pattern=NAME)]
    description: str | None = None
    input_schema: dict[str, Any]  # a JSON schema of type object: any JSON schema keywords
    cache_control: _Cache = None
    strict: bool | None = None  # a call is always constrained to the schema, strict or not
    defer_loading: bool | None = None
    input_examples: Annotated[list[dict[str, Any]] | None, Hint("examples are not shown to the model",
                                                                neutral=_always)] = None  # fmt: skip
    eager_input_streaming: Annotated[bool | None, Hint("a call's input is streamed as it is generated either way",
                                                       neutral=_always)] = None  # fmt: skip
    allowed_callers: Annotated[list[str] | None, Hint("every tool is called directly by the model here",
                                                      neutral=_always)] = None  # fmt: skip


class ServerTool(AnthropicDeclared):
    """A tool Anthropic's servers run (web search, code execution, bash...): left out of what the model sees (its
    fields unread); under strict_params, refused."""

    model_config = ConfigDict(extra="allow")
    type: str
    name: str | None = None


if TYPE_CHECKING:
    Tool = ClientTool | ServerTool
else:
    Tool = tagged(ClientTool, other=ServerTool)


class ToolChoiceAuto(AnthropicDeclared):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(AnthropicDeclared):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(AnthropicDeclared):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(AnthropicDeclared):
    type: Literal["none"]


if TYPE_CHECKING:
    ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone
else:
    ToolChoice = tagged(ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone)


class ThinkingEnabled(AnthropicDeclared):
    type: Literal["enabled"]
    budget_tokens: Int
    display: str | None = None


class ThinkingAdaptive(AnthropicDeclared):
    type: Literal["adaptive"]
    display: str | None = None


class ThinkingDisabled(AnthropicDeclared):
    type: Literal["disabled"]


if TYPE_CHECKING:  # the request's `thinking`: a hint (this model has no extended thinking)
    Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled
else:
    Thinking = tagged(ThinkingEnabled, ThinkingAdaptive, ThinkingDisabled)


class JsonOutputFormat(AnthropicDeclared):
    """output_config.format: the answer is constrained to the schema."""

    type: Literal["json_schema"]
    schema_: Annotated[dict[str, Any], Field(alias="schema")]  # any JSON schema
