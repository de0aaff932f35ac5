"""The shapes of Claude Code's and Codex CLI's first requests (captured from 2.1.328 and 0.169.0, trimmed), shared
by the tests that serve them (tests/test_gateway_messages.py, tests/test_gateway_responses.py) and translate them
(tests/test_client_hints.py). tests/test_clients_cli.py runs the CLIs themselves."""

from __future__ import annotations

from typing import Any

SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "maxLength": 32}}, "required": ["path"]}

# hints the server accepts with no effect, a per-turn system message with its own effort, a deferred tool and a
# server tool it leaves out
CLAUDE_CODE: dict[str, Any] = {
    "model": "claude-opus-5-5",
    "max_tokens": 128000,
    "stream": True,
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium"},
    "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
    ],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Name a fruit.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}], "output_config": {"effort": "medium"}},
    ],
    "tools": [
        {"name": "Read", "description": "Read a file", "input_schema": SCHEMA},
        {"name": "DeferredToolPlaceholder", "input_schema": {"type": "object", "properties": {}}, "defer_loading": True},
        {"type": "web_search_20250305", "name": "web_search"},
    ],
}
CLAUDE_CODE_LEFT_OUT = ("DeferredToolPlaceholder", "web_search")

FUNCTION = {"type": "function", "name": "exec_command", "description": "Run a command.", "parameters": SCHEMA}
# client_metadata, reasoning, include, verbosity and prompt_cache_key; a custom (grammar) tool, a namespace with a
# function and a hosted tool, tool_search and web_search
CODEX: dict[str, Any] = {
    "model": "gpt-5.5-codex",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are terse."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name a fruit."}]},
    ],
    "tools": [
        FUNCTION,
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: x"}},
        {"type": "namespace", "name": "mcp__x", "tools": [{**FUNCTION, "name": "mcp__x__ls"}, {"type": "web_search"}]},
        {"type": "tool_search", "execution": "client", "description": "search", "parameters": {"type": "object"}},
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a2210d-9626-74e1-a08c-db54d6f204bb",
    "text": {"verbosity": "low"},
    "client_metadata": {"session_id": "s", "x-codex-turn-metadata": "{}"},
}
CODEX_OFFERED = ("exec_command", "mcp__x__ls")
CODEX_LEFT_OUT = ("apply_patch", "web_search", "tool_search", "web_search")
