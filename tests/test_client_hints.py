"""What coding agents send, without a server: hints accepted with no effect (and refused under strict_params),
tools left out, a namespace opened, alias patterns, sampling_defaults, the long-context switch, and every
declared hint listed in docs/clients/fields.md. tests/test_clients_cli.py runs the CLIs themselves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from client_requests import CLAUDE_CODE, CLAUDE_CODE_LEFT_OUT, CODEX, CODEX_LEFT_OUT, CODEX_OFFERED

from backend.config import EngineConfig
from gateway.aliases import Aliases
from gateway.anthropic.models import model_list
from gateway.anthropic.request import MessagesBody, translate, translate_count
from gateway.config import ConfigError, from_mapping
from gateway.errors import InvalidRequest
from gateway.openai_responses.request import ResponsesBody, chat_body, parse_request
from gateway.protocol.declared import Refused, policy_of
from gateway.protocol.requests import ChatBody, CompletionBody, EmbeddingBody, parse_chat

ROOT = Path(__file__).resolve().parents[1]
READ = CLAUDE_CODE["tools"][0]
CLAUDE: dict[str, Any] = CLAUDE_CODE


def _id(prefix: str) -> str:
    return prefix + "0"


def test_claude_codes_request_translates_with_its_hints_ignored() -> None:
    req = translate(CLAUDE)
    chat = req.chat
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "system"]
    assert [t["function"]["name"] for t in chat["tools"]] == ["Read"] and req.left_out == CLAUDE_CODE_LEFT_OUT
    assert chat["user"] == CLAUDE["metadata"]["user_id"] and chat["max_tokens"] == 128000 and not req.prefill
    assert not {"thinking", "context_management", "output_config"} & set(chat)
    parse_chat({k: v for k, v in chat.items() if k not in ("stream", "stream_options")})  # the chat pipeline takes it


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({}, "thinking"),
        ({"thinking": None}, "context_management"),
        ({"thinking": None, "context_management": None}, "output_config.effort"),
        ({"thinking": None, "context_management": None, "output_config": None}, "messages[1].output_config.effort"),
    ],
)
def test_strict_params_refuses_each_hint_by_name(change: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        translate({**CLAUDE, **change}, strict=True)
    assert err.value.param == param and "strict_params" in err.value.message


def test_strict_params_refuses_left_out_tools_and_keeps_neutral_values() -> None:
    quiet = {**CLAUDE, "thinking": {"type": "disabled"}, "context_management": None, "output_config": None}
    quiet["messages"] = CLAUDE["messages"][:1]
    with pytest.raises(InvalidRequest) as err:
        translate(quiet, strict=True)
    assert err.value.param == "tools[1].defer_loading"
    assert translate({**quiet, "tools": [READ]}, strict=True).chat["tools"]


def test_prefill_thinking_blocks_and_count_tokens() -> None:
    thought = {"type": "thinking", "thinking": "", "signature": "s"}
    messages = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": [thought, {"type": "text", "text": "Hel"}]}]
    req = translate({**CLAUDE, "messages": messages})
    assert req.prefill == "Hel" and req.chat["continue_final_message"] is True
    assert req.chat["messages"][-1] == {"role": "assistant", "content": "Hel"}
    model, chat = translate_count({k: v for k, v in CLAUDE.items() if k not in ("max_tokens", "stream", "metadata")})
    assert model == "claude-opus-5-5" and len(chat["tools"]) == 1
    with pytest.raises(InvalidRequest) as err:
        translate({**CLAUDE, "thinking": {"type": "sometimes"}})
    assert err.value.param == "thinking.type"


def test_codex_request_opens_the_namespace_and_leaves_hosted_tools_out() -> None:
    req = parse_request(CODEX, _id)
    assert tuple(t["name"] for t in req.tools) == CODEX_OFFERED and req.left_out == CODEX_LEFT_OUT
    assert req.text["verbosity"] == "low" and req.echo["prompt_cache_key"] == CODEX["prompt_cache_key"]
    body = chat_body(req, [{"role": "user", "content": "Hi."}], "m")
    assert body["prompt_cache_key"] == CODEX["prompt_cache_key"] and len(body["tools"]) == 2


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({}, "reasoning"),  # a body's own hints first, in declared order, then those inside its objects
        ({"reasoning": None}, "client_metadata"),
        ({"reasoning": None, "client_metadata": None}, "text.verbosity"),
        ({"reasoning": None, "text": None, "client_metadata": None}, "include"),
        ({"reasoning": None, "text": None, "client_metadata": None, "include": None}, "tools[1].type"),
    ],
)
def test_responses_strict_params_refuses_by_name(change: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse_request({**CODEX, **change}, _id, strict=True)
    assert err.value.param == param


def test_chat_continue_final_message_needs_an_assistant_turn() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi."}], "continue_final_message": True}
    with pytest.raises(InvalidRequest):
        parse_chat(body)
    body["messages"].append({"role": "assistant", "content": "Hel"})
    assert parse_chat(body).continue_final


def test_alias_patterns_exact_first_then_longest_prefix() -> None:
    aliases = Aliases({"claude-*": "a", "claude-haiku*": "b", "claude-x": "c", "gpt-5*": "a", "o*": "gone"}, {"a", "b", "c"})
    assert aliases.get("claude-opus-5-5", "?") == "a" and aliases.get("claude-haiku-4-5", "?") == "b"
    assert aliases.get("claude-x", "?") == "c" and aliases.get("gpt-5.5-codex", "?") == "a"
    assert aliases.get("a", "?") == "a" and aliases.get("o3", "?") == "?"  # a served name; a pattern to nothing served
    assert dict(aliases.items()) == {"claude-x": "c"}


def test_shipped_aliases_follow_the_served_model() -> None:
    """Serving another model than the default (SMOLGATE_MODEL=gemma...), the shipped aliases name it: Claude Code's
    `claude-*` and the OpenAI names reach the one chat model; an operator's alias to an unserved model stays unapplied."""
    from gateway.aliases import retarget_defaults
    from gateway.config import DEFAULT_ALIASES, DEFAULT_MODELS

    served = {"gemma-3-270m-q4_k_m": "chat", "all-MiniLM-L6-v2": "embedding"}
    moved = retarget_defaults({**DEFAULT_ALIASES, "mine": "not-served"}, DEFAULT_MODELS, served)
    aliases = Aliases(moved, served)
    assert aliases.get("claude-opus-5-5", "?") == aliases.get("gpt-4o", "?") == "gemma-3-270m-q4_k_m"
    assert aliases.get("text-embedding-3-small", "?") == "all-MiniLM-L6-v2" and aliases.get("mine", "?") == "?"
    two = {"a": "chat", "b": "chat"}  # more than one chat model: no guess, the shipped aliases stay unapplied
    assert Aliases(retarget_defaults(DEFAULT_ALIASES, DEFAULT_MODELS, two), two).get("claude-opus-5-5", "?") == "?"
    assert retarget_defaults(DEFAULT_ALIASES, DEFAULT_MODELS, {"SmolLM2-135M-Instruct": "chat"}) == dict(DEFAULT_ALIASES)


def test_anthropic_model_list_shape() -> None:
    listed = model_list([{"id": "m", "object": "model", "created": 0, "owned_by": "smolgate"}])
    assert listed == {
        "data": [{"type": "model", "id": "m", "display_name": "m", "created_at": "1970-01-01T00:00:00Z"}],
        "has_more": False, "first_id": "m", "last_id": "m",
    }  # fmt: skip


def test_sampling_defaults_and_strict_params_config() -> None:
    cfg = from_mapping({"sampling_defaults": {"temperature": 0}, "strict_params": True})
    assert dict(cfg.sampling_defaults) == {"temperature": 0} and cfg.strict_params
    for bad in ({"temperature": "0"}, {"max_tokens": 3}, [0]):
        with pytest.raises(ConfigError):
            from_mapping({"sampling_defaults": bad})


def test_long_context_needs_its_switch() -> None:
    assert EngineConfig(max_model_len=16384).context_len(8192) == 8192
    assert EngineConfig(max_model_len=16384, allow_long_max_model_len=True).context_len(8192) == 16384
    assert EngineConfig(allow_long_max_model_len=True).context_len(8192) == 8192


def test_every_declared_hint_is_in_the_docs_table() -> None:
    text = (ROOT / "docs" / "clients" / "fields.md").read_text()
    messages, rest = text.split("## Responses", 1)  # each endpoint's hints in its own section
    responses, chat = rest.split("## Chat Completions", 1)
    for params, part in ((MessagesBody, messages), (ResponsesBody, responses),
                         (ChatBody, chat), (CompletionBody, chat), (EmbeddingBody, chat)):  # fmt: skip
        listed = set(re.findall(r"`([\w.\[\]]+)`", part))
        missing = [path for path in params.hints() if path not in listed]
        assert not missing, f"docs/clients/fields.md does not list {missing}"
    assert ChatBody.hints() and MessagesBody.hints() and ResponsesBody.hints()
    refused = [name for name in ChatBody.model_fields if isinstance(policy_of(ChatBody, name), Refused)]
    assert refused and all(f"`{name}`" in chat for name in refused), "the chat section lists every refused field"
