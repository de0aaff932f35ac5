"""/v1/responses through the router with no embedded engine: an OpenAI-compatible upstream (the fake one of
tests/routing_fixtures.py) receives a translated chat-completions request, its answer (JSON or SSE chunks)
comes back as a Response object or the Responses event stream; retries and a key's model policy apply."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from gateway_fixtures import assert_schema
from routing_fixtures import WORDS, FakeUpstream, Servers

from gateway.app import build_context, create_app
from gateway.config import from_mapping

KEY, NARROW = "sk-resp-router", "sk-resp-narrow"


@pytest.fixture(scope="module")
def rig() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream("up")
    upstreams = Servers()
    (up_url,) = upstreams.start([fake.app()])
    dep = {"kind": "openai", "name": "up", "base_url": f"{up_url}/v1", "timeout_s": 2.0}
    config = from_mapping(
        {
            "api_keys": [KEY, {"key": NARROW, "name": "narrow", "models": ["other"]}],
            "embeddings": False,
            "cache": {"backend": "off"},
            "models": {"remote": {"deployments": [dep]}, "other": {"deployments": [dep]}},
            "router": {"backoff_base_s": 0.01, "cooldown_failures": 5},
        }
    )
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, None, None))])
    yield fake, url
    gateway.stop()
    upstreams.stop()


def _client(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


def test_upstream_gets_a_chat_request_and_the_client_a_response(rig: tuple[FakeUpstream, str]) -> None:
    fake, url = rig
    fake.play("500", default="ok")  # the first attempt fails: the router retries
    raw = _client(url).responses.with_raw_response.create(
        model="remote", instructions="Be brief.", input="Hi there", max_output_tokens=32, temperature=0
    )
    body = raw.http_response.json()
    assert_schema("Response", body)
    assert raw.headers["x-smolgate-deployment"] == "up" and fake.received == 2
    sent = fake.bodies[-1]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    assert sent["max_completion_tokens"] == 32 and "input" not in sent
    resp = raw.parse()
    assert resp.output_text == "".join(WORDS) and resp.status == "completed"
    assert resp.usage is not None and (resp.usage.input_tokens, resp.usage.output_tokens) == (11, 6)
    again = _client(url).responses.retrieve(resp.id)
    assert again.output_text == resp.output_text


def test_streamed_through_an_upstream(rig: tuple[FakeUpstream, str]) -> None:
    fake, url = rig
    fake.play(default="ok")
    events = []
    with httpx.stream("POST", f"{url}/v1/responses", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "remote", "input": "Hi", "stream": True}) as r:  # fmt: skip
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                assert_schema("ResponseStreamEvent", events[-1])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "".join(WORDS)
    assert events[-1]["type"] == "response.completed" and events[-1]["response"]["usage"]["output_tokens"] == 6
    assert fake.bodies[-1]["stream"] is True


def test_a_dropped_upstream_stream_fails_the_response(rig: tuple[FakeUpstream, str]) -> None:
    fake, url = rig
    fake.play("drop", default="ok")
    with _client(url).responses.stream(model="remote", input="Hi") as stream:
        events = list(stream)
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    assert events[-1].response.status == "failed"  # type: ignore[union-attr]


def test_a_keys_model_policy_applies(rig: tuple[FakeUpstream, str]) -> None:
    _, url = rig
    with pytest.raises(openai.NotFoundError) as err:
        _client(url, NARROW).responses.create(model="remote", input="Hi")
    assert err.value.body["param"] == "model"  # type: ignore[index]
    assert _client(url, NARROW).responses.input_tokens.count(model="other", input="Hi there").input_tokens > 0


def test_unsupported_fields_never_reach_the_upstream(rig: tuple[FakeUpstream, str]) -> None:
    fake, url = rig
    fake.play(default="ok")
    with pytest.raises(openai.BadRequestError) as err:
        _client(url).responses.create(model="remote", input="Hi", extra_body={"conversation": "conv_1"})
    assert err.value.body["param"] == "conversation"  # type: ignore[index]
    assert fake.received == 0
    # a tool the gateway cannot run is left out of the chat request, upstream too
    _client(url).responses.create(model="remote", input="Hi", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert fake.received == 1 and "tools" not in fake.bodies[-1]


def test_an_upstream_answer_in_another_dialect_is_a_clear_502(rig: tuple[FakeUpstream, str]) -> None:
    fake, url = rig
    fake.play(default="dialect")
    with pytest.raises(openai.InternalServerError) as info:
        _client(url).responses.create(model="remote", input="Hi there")
    assert info.value.status_code == 502
    assert info.value.body == {"message": "The model's answer came back in an unexpected shape.", "type": "server_error",
                               "param": None, "code": "upstream_error"}  # fmt: skip
    fake.play(default="ok")
