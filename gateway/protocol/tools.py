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
from gateway.protocol.fields import Body
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


def parse_tools(body: Body) -> ToolConfig | None:
    """None when the request has no tools or tool_choice is "none"."""
    raw = body.get("tools")
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest("Invalid type for 'parallel_tool_calls': expected a boolean.", param="parallel_tool_calls")
    if raw is None:
        if choice not in (None, "none"):
            raise InvalidRequest("'tool_choice' is only allowed when 'tools' are specified.", param="tool_choice")
        return None
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("'tools' must be a non-empty array of tool objects.", param="tools")
    tools = tuple(_tool(i, t) for i, t in enumerate(raw))
    if len({t.name for t in tools}) != len(tools):
        raise InvalidRequest("Tool names in 'tools' must be unique.", param="tools")
    mode, forced = _choice(choice, {t.name for t in tools})
    if mode == "none":
        return None
    return ToolConfig(tools, mode, forced, parallel is not False)


def _tool(i: int, tool: object) -> Tool:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidRequest(f"'{where}' must be {{'type': 'function', 'function': {{...}}}}.", param=where)
    fn = tool["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequest(f"'{where}.function.name' must match ^[a-zA-Z0-9_-]{{1,64}}$.", param=f"{where}.function.name")
    params = fn.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise InvalidRequest(f"'{where}.function.parameters' must be a JSON schema object.", param=f"{where}.function.parameters")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise InvalidRequest(f"'{where}.function.description' must be a string.", param=f"{where}.function.description")
    return Tool(name, description, params)


def _choice(choice: object, names: set[str]) -> tuple[Choice | Literal["none"], str | None]:
    if choice is None or choice == "auto":
        return "auto", None
    if choice in ("none", "required"):
        return choice, None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise InvalidRequest(f"'tool_choice' names {name!r}, which is not in 'tools'.", param="tool_choice")
        return "named", name
    raise InvalidRequest(
        "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}.",
        param="tool_choice",
    )


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
