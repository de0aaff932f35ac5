"""`tools`, `tool_choice`, `parallel_tool_calls` -> a ToolConfig: the tool prompt and the call grammar.

The model's chat template has no tool support (SmolLM2's has none), so tools are described in the
system message in a documented format (docs/structured-outputs.md), and a call is

    <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>

`required` and a named function force calls through a llguidance Lark grammar (the engine's
`guided_grammar`); `auto` constrains the output to "plain text, or tool calls" (text may not start
with `<`); `none` sends neither the tools nor a grammar.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import InvalidRequest
from gateway.protocol.json_schema import close_objects

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
Choice = Literal["auto", "required", "named"]


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolConfig:
    tools: tuple[Tool, ...]
    choice: Choice
    forced: str | None  # the function a named tool_choice forces
    parallel: bool


def tool_config(tools: tuple[Tool, ...], choice: str | None, parallel: bool) -> ToolConfig | None:
    """None when the request has no tools or tool_choice is "none". `choice`: none, auto, required, or the name
    a named tool_choice forces."""
    if not tools:
        if choice not in (None, "none"):
            raise InvalidRequest("'tool_choice' is only allowed when 'tools' are specified.", param="tool_choice")
        return None
    names = {t.name for t in tools}
    if len(names) != len(tools):
        raise InvalidRequest("Tool names in 'tools' must be unique.", param="tools")
    if choice == "none":
        return None
    if choice in (None, "auto", "required"):
        return ToolConfig(tools, "required" if choice == "required" else "auto", None, parallel)
    if choice not in names:
        raise InvalidRequest(f"'tool_choice' names {choice!r}, which is not in 'tools'.", param="tool_choice")
    return ToolConfig(tools, "named", choice, parallel)


def tool_prompt(config: ToolConfig) -> str:
    """The system-message text that describes the tools and the call format."""
    lines = [
        "You can call functions. The available functions, one JSON object per line:",
        *(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}) for t in config.tools),
        f'To call a function, reply with {OPEN}{{"name": <function name>, "arguments": <JSON object>}}{CLOSE}'
        + (" (one block per call)." if config.parallel else "."),
    ]
    if config.choice == "named":
        lines.append(f"You must call {config.forced}.")
    elif config.choice == "required":
        lines.append("You must call a function.")
    else:
        lines.append("If no function fits, answer in plain text.")
    return "\n".join(lines)


def _call_schema(tools: tuple[Tool, ...]) -> dict[str, Any]:
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": close_objects(t.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return {**schema, "x-guidance": {"whitespace_flexible": False}}


def tool_grammar(config: ToolConfig) -> str:
    """A llguidance Lark grammar: the calls (forced), or plain text or calls (auto)."""
    tools = tuple(t for t in config.tools if config.forced in (None, t.name))
    calls = "call+" if config.parallel else "call"
    start = calls if config.choice != "auto" else f"TEXT | {calls}"
    return "\n".join(
        [
            f"start: {start}",
            f"call: {json.dumps(OPEN)} body {json.dumps(CLOSE)}",
            f"body: %json {json.dumps(_call_schema(tools))}",
            r"TEXT: /[^<][\s\S]*/",
        ]
    )
