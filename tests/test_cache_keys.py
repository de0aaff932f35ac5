"""Complete cache keys: every setting that can change the generated text changes the key, one at a time.

Engine side (`model_fingerprint`): every EngineConfig field is either in the fingerprint (OUTPUT_ENGINE_FIELDS) or
listed with the reason it is left out (NON_OUTPUT_ENGINE_FIELDS); the files that define the model (weights, config,
tokenizer, chat template) and the engine's resolved `auto` settings are in it too. Request side (`exact_key`,
`semantic_scope`): every field the chat and completions parsers accept is classified here — it changes the key, it
is deliberately left out (with the reason), or only its default value is accepted — so a field added to a parser
without a decision fails this test.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest

from backend.config import EngineConfig
from gateway.cache.keys import NON_OUTPUT_ENGINE_FIELDS, OUTPUT_ENGINE_FIELDS, exact_key, model_fingerprint, semantic_scope
from gateway.errors import InvalidRequest
from gateway.protocol.declared import Refused, policy_of
from gateway.protocol.requests import ChatBody, CompletionBody, parse_chat, parse_completion

# A changed value for each string setting (others: a bool flips, a number moves).
_ENGINE_ALTERNATIVES: dict[str, Any] = {
    "model": "/models/another", "quantization": "int8", "served_model_name": "renamed", "dtype": "bfloat16",
    "device": "cuda", "int4_cpu_kernel": "torch", "kernel_backend": "triton", "kv_cache_dtype": "bfloat16",
    "speculative_method": "medusa", "speculative_model": "/models/draft",
}  # fmt: skip
RESOLVED = {"device": "cpu", "kernels": "cpu", "kv_cache_dtype": "float32", "per_token_prefill": True,
            "layers": ["Int4Linear(group=128, mode=w4a8)"], "threads": 2, "torch": "2.13.0"}  # fmt: skip


def _changed(cfg: EngineConfig, name: str) -> EngineConfig:
    value = getattr(cfg, name)
    if isinstance(value, bool):
        new: Any = not value
    elif isinstance(value, int | float):
        new = value + 1 if isinstance(value, int) else value / 2 + 0.125
    else:
        new = _ENGINE_ALTERNATIVES.get(name, f"{value}-changed")
    assert new != value, name
    return replace(cfg, **{name: new})


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / name).write_text(f"{name} v1")
    return tmp_path


def test_every_engine_setting_is_classified() -> None:
    names = {f.name for f in fields(EngineConfig)}
    assert not set(OUTPUT_ENGINE_FIELDS) & set(NON_OUTPUT_ENGINE_FIELDS)
    assert names == set(OUTPUT_ENGINE_FIELDS) | set(NON_OUTPUT_ENGINE_FIELDS), (
        f"classify these EngineConfig fields in gateway/cache/keys.py: "
        f"{sorted(names ^ (set(OUTPUT_ENGINE_FIELDS) | set(NON_OUTPUT_ENGINE_FIELDS)))}"
    )


def test_each_output_affecting_engine_setting_changes_the_fingerprint(model_dir: Path) -> None:
    base = EngineConfig(model=str(model_dir))
    fp = model_fingerprint("m", base, "", RESOLVED)
    assert fp == model_fingerprint("m", base, "", dict(RESOLVED))  # stable
    seen = {fp}
    for name in OUTPUT_ENGINE_FIELDS:
        changed = model_fingerprint("m", _changed(base, name), "", RESOLVED)
        assert changed not in seen, f"{name} does not change the fingerprint"
        seen.add(changed)
    for name in NON_OUTPUT_ENGINE_FIELDS:  # deliberately out: capacity and scheduling
        assert model_fingerprint("m", _changed(base, name), "", RESOLVED) == fp, name
    assert model_fingerprint("other-model", base, "", RESOLVED) != fp
    assert model_fingerprint("m", base, "operator-salt", RESOLVED) != fp


def test_the_engines_resolved_auto_settings_change_the_fingerprint(model_dir: Path) -> None:
    """`auto` resolves per machine (device, KV dtype, INT4 kernel, threads): replicas sharing a Redis cache on
    different hardware must not share entries."""
    base = EngineConfig(model=str(model_dir))
    fp = model_fingerprint("m", base, "", RESOLVED)
    changes = {"device": "cuda", "kernels": "triton", "kv_cache_dtype": "bfloat16", "per_token_prefill": False,
               "layers": ["Int4Linear(group=128, mode=int4pack, dense)"], "threads": 16, "torch": "2.14.0"}  # fmt: skip
    for name, value in changes.items():
        assert model_fingerprint("m", base, "", {**RESOLVED, name: value}) != fp, name
    assert model_fingerprint("m", base) != fp  # an engine that says nothing is another engine


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                                  "chat_template.jinja"])  # fmt: skip
def test_the_model_files_change_the_fingerprint(model_dir: Path, name: str) -> None:
    """Weights, architecture, tokenizer and chat template: a file rewritten (size or mtime) is another model."""
    cfg = EngineConfig(model=str(model_dir))
    fp = model_fingerprint("m", cfg)
    path = model_dir / name
    stat = path.stat()
    path.write_text(f"{name} v2")  # same size, later mtime
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert model_fingerprint("m", cfg) != fp


# ---- request fields --------------------------------------------------------------------------------------------
_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}
# field -> (extra fields in both requests, the changed value): each must give another key.
CHAT_CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "messages": ({}, [{"role": "user", "content": "Name a tree."}]),
    "temperature": ({}, 0.7), "top_p": ({}, 0.5), "n": ({}, 2), "stop": ({}, ["\n"]), "seed": ({}, 7),
    "presence_penalty": ({}, 0.5), "frequency_penalty": ({}, 0.5), "logit_bias": ({}, {"42": 5}),
    "top_k": ({}, 5), "min_p": ({}, 0.1), "repetition_penalty": ({}, 1.2), "min_tokens": ({}, 2),
    "ignore_eos": ({}, True), "stop_token_ids": ({}, [2]), "include_stop_str_in_output": ({}, True),
    "max_tokens": ({}, 9), "max_completion_tokens": ({}, 9),
    "logprobs": ({}, True), "top_logprobs": ({"logprobs": True}, 3),
    "response_format": ({}, {"type": "json_object"}),
    "tools": ({}, [_TOOL]), "tool_choice": ({"tools": [_TOOL]}, "required"),
    "parallel_tool_calls": ({"tools": [_TOOL]}, False),
    "function_call": ({}, "none"),  # a no-op here, but kept in the key: unknown effect means in the key
    "continue_final_message": (
        {"messages": [{"role": "user", "content": "Name a tree."}, {"role": "assistant", "content": "The"}]}, True
    ),
}  # fmt: skip
COMPLETION_CHANGES: dict[str, tuple[dict[str, Any], Any]] = {
    "prompt": ({}, "Once upon a time"), "echo": ({}, True), "logprobs": ({}, 2), "max_tokens": ({}, 9),
    **{k: v for k, v in CHAT_CHANGES.items() if k in {"temperature", "top_p", "n", "stop", "seed", "presence_penalty",
       "frequency_penalty", "logit_bias", "top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
       "stop_token_ids", "include_stop_str_in_output"}},
}  # fmt: skip
# Deliberately not in the key, and why (README "What the cache key covers").
SAME_KEY: dict[str, tuple[dict[str, Any], str]] = {
    "model": ({"model": "gpt-4o"}, "the model that runs is in the fingerprint; aliases of one model share entries"),
    "stream": ({"stream": True}, "one entry replays as JSON or as a stream"),
    "stream_options": ({"stream": True, "stream_options": {"include_usage": True}}, "replay adds usage when asked"),
    "user": ({"user": "u-42"}, "an end-user id for abuse tracking: no effect on the text"),
    "metadata": ({"metadata": {"team": "x"}}, "bookkeeping"),
    "safety_identifier": ({"safety_identifier": "s-1"}, "bookkeeping"),
    "prompt_cache_key": ({"prompt_cache_key": "k-1"}, "a hint for the provider's prefix cache (ours is automatic)"),
    "service_tier": ({"service_tier": "flex"}, "billing and latency tier"),
    "priority": ({"priority": -5}, "scheduling order only"),
}
DEFAULT_ONLY = {"modalities", "store", "best_of", "suffix"}  # any other value is refused (400): nothing to key


def _chat_key(body: dict[str, Any], ids: tuple[int, ...] = (1, 2, 3)) -> tuple[str, str]:
    req = parse_chat(dict(body))
    key = exact_key("ns", "fp", "chat", body, params=req.params, prompt=req.messages, prompt_ids=list(ids))
    scope = semantic_scope("ns", "fp", "emb", "chat", body=body, params=req.params, context=req.messages[:-1])
    return key, scope


def _completion_key(body: dict[str, Any]) -> str:
    req = parse_completion(dict(body))
    return exact_key("ns", "fp", "completions", body, params=req.params, prompt=req.prompts, prompt_ids=None)


def _chat_base(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 6,
            "temperature": 0, **extra}  # fmt: skip


def test_every_request_field_is_classified() -> None:
    refused = {name for name in ChatBody.model_fields if isinstance(policy_of(ChatBody, name), Refused)}
    classified = set(CHAT_CHANGES) | set(SAME_KEY) | DEFAULT_ONLY | refused
    assert set(ChatBody.model_fields) - classified == set(), "classify these chat fields in tests/test_cache_keys.py"
    assert set(CompletionBody.model_fields) - set(COMPLETION_CHANGES) - set(SAME_KEY) - DEFAULT_ONLY == set()
    assert refused, "ChatBody declares the fields it refuses"
    for field in refused:  # refused whatever their value: they never reach a key
        with pytest.raises(InvalidRequest):
            parse_chat(_chat_base(**{field: "x"}))


@pytest.mark.parametrize("field", sorted(CHAT_CHANGES))
def test_each_chat_field_changes_the_key(field: str) -> None:
    both, value = CHAT_CHANGES[field]
    key, scope = _chat_key(_chat_base(**both))
    changed_key, changed_scope = _chat_key(_chat_base(**both, **{field: value}))
    assert changed_key != key
    if field != "messages":  # the last user message is what a semantic lookup matches, not its scope
        assert changed_scope != scope


@pytest.mark.parametrize("field", sorted(COMPLETION_CHANGES))
def test_each_completion_field_changes_the_key(field: str) -> None:
    both, value = COMPLETION_CHANGES[field]
    base = {"model": "gpt-3.5-turbo-instruct", "prompt": "The sky is", "max_tokens": 6, "temperature": 0, **both}
    assert _completion_key({**base, field: value}) != _completion_key(base)


@pytest.mark.parametrize("field", sorted(SAME_KEY))
def test_transport_and_bookkeeping_fields_do_not_change_the_key(field: str) -> None:
    changes, _why = SAME_KEY[field]
    assert _chat_key(_chat_base(**changes)) == _chat_key(_chat_base())


def test_the_chat_template_output_is_in_the_key() -> None:
    """The same messages rendered by another chat template (other prompt token ids) are another request."""
    assert _chat_key(_chat_base(), ids=(1, 2, 3)) != _chat_key(_chat_base(), ids=(1, 2, 4))


def test_synonyms_share_a_key() -> None:
    """Folded into SamplingParams before hashing: 0 and 0.0, max_tokens and max_completion_tokens are one key."""
    assert _chat_key(_chat_base(temperature=0.0)) == _chat_key(_chat_base(temperature=0))
    renamed = {k: v for k, v in _chat_base(max_completion_tokens=9).items() if k != "max_tokens"}
    assert _chat_key(_chat_base(max_tokens=9)) == _chat_key(renamed)
