"""/v1/messages through the router (no engine: fake OpenAI-compatible upstreams, tests/routing_fixtures.py):
upstreams receive a translated Chat Completions request, answers and streams come back as Anthropic messages
and events, the key's allowed models and rpm apply as on chat, and every failure is an Anthropic error."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import pytest
from routing_fixtures import FakeUpstream, Servers

from gateway.app import build_context, create_app
from gateway.config import from_mapping

KEY, NARROW = "sk-messages-router", "sk-messages-narrow"
FAST = {"timeout_s": 1.0, "first_token_timeout_s": 0.5, "idle_timeout_s": 0.5, "connect_timeout_s": 0.5}
ASK = [{"role": "user", "content": "hi"}]
TEXT = "Hello from the fake upstream."


@dataclass
class Rig:
    fakes: dict[str, FakeUpstream]
    url: str

    def client(self, key: str = KEY) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    fakes = {n: FakeUpstream(n) for n in "abc"}
    upstreams = Servers()
    urls = dict(zip(fakes, upstreams.start([f.app() for f in fakes.values()]), strict=True))

    def dep(name: str) -> dict[str, Any]:
        return {"kind": "openai", "name": name, "base_url": f"{urls[name]}/v1", "model": f"up-{name}", **FAST}

    config = from_mapping(
        {
            "api_keys": [KEY, {"key": NARROW, "name": "narrow", "models": ["main"], "rpm": 2}],
            "embeddings": False,
            "cache": {"backend": "off"},
            "models": {
                "main": {"deployments": [dep("a")]},
                "other": {"deployments": [dep("b")]},
                "bad": {"deployments": [dep("c")]},
            },
            "router": {"num_retries": 1, "backoff_base_s": 0.01, "backoff_max_s": 0.02, "cooldown_failures": 100},
        }
    )
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, None, None))])
    yield Rig(fakes, url)
    gateway.stop()
    upstreams.stop()


def test_the_upstream_gets_a_chat_request_and_the_client_a_message(rig: Rig) -> None:
    rig.fakes["a"].play(default="ok")
    raw = rig.client().messages.with_raw_response.create(
        model="main", max_tokens=8, system="Be brief.", messages=ASK, stop_sequences=["STOP"], metadata={"user_id": "u1"}
    )
    msg = raw.parse()
    assert raw.headers["x-smolgate-model"] == "main" and raw.headers["x-smolgate-deployment"] == "a"
    assert msg.id.startswith("msg_") and [b.text for b in msg.content if b.type == "text"] == [TEXT]
    assert msg.stop_reason == "end_turn" and msg.usage.input_tokens == 11 and msg.usage.output_tokens == 6
    (body,) = rig.fakes["a"].bodies
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert body["model"] == "up-a" and body["max_tokens"] == 8 and body["stop"] == ["STOP"] and body["user"] == "u1"
    assert "include_stop_str_in_output" not in body  # an OpenAI upstream would refuse the vLLM extension


def test_a_stream_through_the_router_assembles_the_same_message(rig: Rig) -> None:
    rig.fakes["a"].play(default="ok")
    msg = rig.client().messages.create(model="main", max_tokens=8, messages=ASK)
    with rig.client().messages.stream(model="main", max_tokens=8, messages=ASK) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert final.model_dump(exclude={"id"}) == msg.model_dump(exclude={"id"})
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert rig.fakes["a"].bodies[-1]["stream_options"] == {"include_usage": True}


def test_the_keys_models_and_rpm_apply(rig: Rig) -> None:
    rig.fakes["a"].play(default="ok")
    narrow = rig.client(NARROW)
    with pytest.raises(anthropic.NotFoundError) as info:
        narrow.messages.create(model="other", max_tokens=8, messages=ASK)
    assert info.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        narrow.messages.count_tokens(model="other", messages=ASK)
    assert narrow.messages.count_tokens(model="main", messages=ASK).input_tokens > 0
    narrow.messages.create(model="main", max_tokens=8, messages=ASK)
    narrow.messages.create(model="main", max_tokens=8, messages=ASK)
    with pytest.raises(anthropic.RateLimitError) as limited:
        narrow.messages.create(model="main", max_tokens=8, messages=ASK)
    assert limited.value.body["error"]["type"] == "rate_limit_error" and "API key" in limited.value.message
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
    rig.client().messages.create(model="main", max_tokens=8, messages=ASK)  # another key is not limited


def test_upstream_failures_are_anthropic_errors(rig: Rig) -> None:
    rig.fakes["c"].play("400", default="ok")
    with pytest.raises(anthropic.BadRequestError) as bad:
        rig.client().messages.create(model="bad", max_tokens=8, messages=ASK)
    assert bad.value.body["error"] == {"type": "invalid_request_error", "message": "Bad temperature, says the upstream."}
    rig.fakes["c"].play(default="500")
    with pytest.raises(anthropic.OverloadedError) as down:
        rig.client().messages.create(model="bad", max_tokens=8, messages=ASK)
    assert down.value.response.status_code == 529 and down.value.body["error"]["type"] == "overloaded_error"
    rig.fakes["c"].play("drop", default="ok")
    resp = httpx.post(
        f"{rig.url}/v1/messages",
        json={"model": "bad", "max_tokens": 8, "messages": ASK, "stream": True},
        headers={"x-api-key": KEY},
    )
    events = [e for e in resp.text.split("\n\n") if e.strip()]
    assert events[0].startswith("event: message_start") and events[-1].startswith("event: error")
    assert '"type":"api_error"' in events[-1] and "message_stop" not in resp.text
    rig.fakes["c"].play(default="ok")


def test_an_upstream_answer_in_another_dialect_is_a_clear_502(rig: Rig) -> None:
    rig.fakes["c"].play(default="dialect")
    answer = httpx.post(f"{rig.url}/v1/messages", json={"model": "bad", "max_tokens": 8, "messages": ASK},
                        headers={"x-api-key": KEY})  # fmt: skip
    assert answer.status_code == 502
    assert answer.json()["error"] == {"type": "api_error", "message": "The model's answer came back in an unexpected shape."}
    rig.fakes["c"].play(default="ok")
