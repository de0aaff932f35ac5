"""The `priority` extension field at the gateway: parsed and validated, a per-API-key default from the config,
left out of the response-cache key (it changes when an answer comes, never what it says)."""

from __future__ import annotations

from pathlib import Path

import gateway_fixtures
import openai
import pytest

from backend.engine.sampling_params import SamplingParams
from gateway.cache.keys import exact_key
from gateway.config import ConfigError, from_mapping, load_config
from gateway.errors import InvalidRequest
from gateway.protocol.requests import parse_chat, parse_completion
from gateway.protocol.sampling import with_key_priority

client = gateway_fixtures.client
live = gateway_fixtures.live
MSG = [{"role": "user", "content": "Name three colors."}]
KEYS = {"sk-batch": 10, "sk-interactive": -5}


def test_priority_is_parsed_and_validated() -> None:
    assert parse_chat({"model": "m", "messages": MSG, "priority": -3}).params.priority == -3
    assert parse_completion({"model": "m", "prompt": "hi"}).params.priority == 0
    for bad in ("high", 1.5, 2**40):
        with pytest.raises(InvalidRequest) as err:
            parse_chat({"model": "m", "messages": MSG, "priority": bad})
        assert err.value.param == "priority"


def test_api_key_default_applies_only_when_the_request_sets_none() -> None:
    cfg = from_mapping({"api_keys": ["sk-batch", "sk-interactive", "sk-other"], "api_key_priorities": KEYS})
    batch, interactive, other = cfg.policies()
    params = SamplingParams()
    assert with_key_priority(params, {}, batch).priority == 10
    assert with_key_priority(params, {}, interactive).priority == -5
    assert with_key_priority(SamplingParams(priority=11), {"priority": 11}, batch).priority == 11
    assert with_key_priority(params, {}, other).priority == 0
    assert with_key_priority(params, {}, None).priority == 0


def test_config_from_yaml_and_env(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("api_keys: [sk-batch]\napi_key_priorities: {sk-batch: 10}\nengine: {priority_aging_s: 2.5}\n")
    cfg = load_config(path, environ={})
    assert dict(cfg.api_key_priorities) == {"sk-batch": 10} and cfg.engine.priority_aging_s == 2.5
    assert "sk-batch" not in repr(cfg)
    cfg = load_config(path, environ={"SMOLGATE_API_KEY_PRIORITIES": "a=1, b=-2", "SMOLGATE_PRIORITY_AGING_S": "0"})
    assert dict(cfg.api_key_priorities) == {"a": 1, "b": -2} and cfg.engine.priority_aging_s == 0.0
    with pytest.raises(ConfigError):
        load_config(path, environ={"SMOLGATE_API_KEY_PRIORITIES": "a=high"})
    path.write_text("api_key_priorities: {sk-batch: high}\n")
    with pytest.raises(ConfigError):
        load_config(path, environ={})


def test_priority_is_not_part_of_the_cache_key() -> None:
    body = {"model": "m", "messages": MSG, "temperature": 0}
    keys = {
        exact_key("ns", "fp", "chat", {**body, "priority": p}, params=SamplingParams(temperature=0, priority=p), prompt=MSG,
            prompt_ids=[1, 2])
        for p in (-5, 0, 10)
    }
    assert len(keys) == 1


def test_priority_through_the_openai_sdk(client: openai.OpenAI) -> None:
    # a later class than the key's (docs/security.md: a request may only ask for its key's class or a later one)
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=MSG, max_tokens=4, extra_body={"priority": 5})
    assert resp.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="gpt-4o-mini", messages=MSG, max_tokens=4, extra_body={"priority": "high"})
    assert err.value.body["param"] == "priority"
