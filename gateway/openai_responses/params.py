"""The objects inside a Responses request, declared (gateway/protocol/declared.py): input items and their content
parts, tools, tool_choice, text.format, reasoning.

Items, parts, tools and choices are told apart by their `type` (`tagged`; a message item may leave its type
out): an error inside one names its path (`input[2].call_id`, `tools[0].tools[1].name`). Items, parts and tools
this server cannot use are declared by their type alone and handled by it, whatever else they hold: built-in
tools are left out of what the model sees; media parts, reasoning items and built-in tool calls are refused
(items.py); a built-in tool in `tool_choice` is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field

from gateway.protocol.declared import Declared, Refused, tagged

_Id = Annotated[str, Field(min_length=1)]
_Status = Literal["in_progress", "completed", "incomplete"]

# Tools this server cannot run, by type: left out of what the model sees (under strict_params, refused)
BUILTIN_TOOLS = {
    "web_search": "web search", "web_search_preview": "web search", "web_search_preview_2025_03_11": "web search",
    "web_search_2025_08_26": "web search", "file_search": "file search", "code_interpreter": "the code interpreter",
    "computer": "computer use", "computer_use": "computer use", "computer_use_preview": "computer use",
    "image_generation": "image generation", "local_shell": "the local shell", "shell": "the shell", "mcp": "MCP servers",
    "apply_patch": "apply_patch", "custom": "custom (free-form grammar) tools", "tool_search": "tool search",
}  # fmt: skip
if TYPE_CHECKING:
    _Builtin = str
else:
    _Builtin = Literal[tuple(BUILTIN_TOOLS)]  # a tuple of strings: one Literal of each

# Input items this server cannot use, by type, and why
UNREAD_ITEMS = {
    "reasoning": "this model produces no reasoning items.",
    "item_reference": "item references are not supported: send the items themselves, or previous_response_id.",
    "file_search_call": "built-in tools are not available on this server.",
    "web_search_call": "built-in tools are not available on this server.",
    "computer_call": "built-in tools are not available on this server.",
    "computer_call_output": "built-in tools are not available on this server.",
    "code_interpreter_call": "built-in tools are not available on this server.",
    "image_generation_call": "built-in tools are not available on this server.",
    "local_shell_call": "built-in tools are not available on this server.",
    "local_shell_call_output": "built-in tools are not available on this server.",
    "mcp_call": "MCP tools are not available on this server.",
    "mcp_list_tools": "MCP tools are not available on this server.",
    "mcp_approval_request": "MCP tools are not available on this server.",
    "mcp_approval_response": "MCP tools are not available on this server.",
    "custom_tool_call": "custom (free-form) tools are not available on this server: use function tools.",
    "custom_tool_call_output": "custom (free-form) tools are not available on this server: use function tools.",
}


# ---- content parts --------------------------------------------------------------------------------------------


class InputText(Declared):
    type: Literal["input_text", "text"]
    text: str


class OutputText(Declared):
    """An earlier answer's text, as a client echoes it back (annotations and logprobs unread)."""

    type: Literal["output_text"]
    text: str
    annotations: list[dict[str, Any]] | None = None
    logprobs: list[dict[str, Any]] | None = None


class RefusalPart(Declared):
    type: Literal["refusal"]
    refusal: str


class MediaPart(Declared):
    """An image, file or audio input: refused by its type (this model reads text only), its other fields unread."""

    model_config = ConfigDict(extra="allow")
    type: Literal["input_image", "input_file", "input_audio"]


if TYPE_CHECKING:  # what mypy sees; pydantic validates the tagged union
    Part = InputText | OutputText | RefusalPart | MediaPart
else:
    Part = tagged(InputText, OutputText, RefusalPart, MediaPart)


# ---- input items ----------------------------------------------------------------------------------------------


class MessageItem(Declared):
    type: Literal["message"] | None = None  # a message may leave its type out
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]
    id: str | None = None
    status: _Status | None = None
    phase: str | None = None  # an assistant message's phase (commentary, final answer): the text is read alike


class FunctionCallItem(Declared):
    type: Literal["function_call"]
    call_id: _Id
    name: _Id
    arguments: str  # JSON text
    id: str | None = None
    status: _Status | None = None


class FunctionCallOutputItem(Declared):
    type: Literal["function_call_output"]
    call_id: _Id
    output: str | list[Part]
    id: str | None = None
    status: _Status | None = None


class UnreadItem(Declared):
    """An item this server cannot use (UNREAD_ITEMS): refused by its type, its other fields unread."""

    model_config = ConfigDict(extra="allow")
    type: Literal[tuple(UNREAD_ITEMS)]  # type: ignore[valid-type]


if TYPE_CHECKING:
    Item = MessageItem | FunctionCallItem | FunctionCallOutputItem | UnreadItem
else:
    Item = tagged(MessageItem, FunctionCallItem, FunctionCallOutputItem, UnreadItem)


# ---- tools ----------------------------------------------------------------------------------------------------


class FunctionTool(Declared):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema: any JSON schema keywords
    strict: bool | None = None  # echoed; a call is always constrained to the parameters' schema


class BuiltinTool(Declared):
    """A tool OpenAI's servers run (BUILTIN_TOOLS): left out of what the model sees, its other fields unread."""

    model_config = ConfigDict(extra="allow")
    type: _Builtin
    name: str | None = None


if TYPE_CHECKING:
    Member = FunctionTool | BuiltinTool
else:
    Member = tagged(FunctionTool, BuiltinTool)


class NamespaceTool(Declared):
    """A group of tools (an MCP server's, say): its function tools are offered under their own names."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[Member]


if TYPE_CHECKING:
    Tool = FunctionTool | NamespaceTool | BuiltinTool
else:
    Tool = tagged(FunctionTool, NamespaceTool, BuiltinTool)


# ---- tool_choice ----------------------------------------------------------------------------------------------


class FunctionChoice(Declared):
    type: Literal["function"]
    name: str


class AllowedTools(Declared):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: Annotated[list[FunctionChoice], Field(min_length=1)]


class BuiltinChoice(Declared):
    model_config = ConfigDict(extra="allow")
    type: Annotated[_Builtin, Refused("this server cannot run built-in tools; only 'function' tools are supported.")]


if TYPE_CHECKING:
    ToolChoice = Literal["auto", "none", "required"] | FunctionChoice | AllowedTools | BuiltinChoice
else:
    ToolChoice = Literal["auto", "none", "required"] | tagged(FunctionChoice, AllowedTools, BuiltinChoice)


# ---- text.format, reasoning -----------------------------------------------------------------------------------


class TextFormat(Declared):
    type: Literal["text"]


class JsonObjectFormat(Declared):
    type: Literal["json_object"]


class JsonSchemaFormat(Declared):
    type: Literal["json_schema"]
    name: str
    schema_: Annotated[dict[str, Any], Field(alias="schema")]  # any JSON schema
    strict: bool | None = None
    description: str | None = None


if TYPE_CHECKING:
    Format = TextFormat | JsonObjectFormat | JsonSchemaFormat
else:
    Format = tagged(TextFormat, JsonObjectFormat, JsonSchemaFormat)


class Reasoning(Declared):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None
