"""The router against misbehaving upstreams (real HTTP servers, tests/routing_fixtures.py): retries, Retry-After,
cooldown and probing, fallbacks, timeouts, broken streams, counted usage, and a clear error when all fails.

The gateway runs without an engine (a pure router: no deployment of kind embedded) with short timeouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from routing_fixtures import FakeUpstream, Servers

from gateway.app import build_context, create_app
from gateway.config import from_mapping

KEY = "sk-router-test"
FAST = {"timeout_s": 1.0, "first_token_timeout_s": 0.5, "idle_timeout_s": 0.5, "connect_timeout_s": 0.5}


@dataclass
class Rig:
    fakes: dict[str, FakeUpstream]
    url: str
    router: Any

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=30)

    def metric(self, prefix: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))

    def reset(self) -> None:
        """Every upstream healthy again, and the router's memory of past failures cleared."""
        for fake in self.fakes.values():
            fake.play(default="ok")
        for balancer in self.router.balancers.values():
            for state in balancer.states:
                state.consecutive_failures, state.cooldown_until, state.probing = 0, 0.0, False


def _config(urls: dict[str, str]) -> dict[str, Any]:
    def dep(name: str) -> dict[str, Any]:
        return {"kind": "openai", "name": name, "base_url": f"{urls[name]}/v1", "model": f"up-{name}", **FAST}

    return {
        "api_keys": [KEY],
        "admin_keys": [KEY],
        "model_aliases": {"gpt-4o-mini": "main"},
        "embeddings": False,
        "cache": {"backend": "off"},
        "models": {
            "main": {"deployments": [dep("a"), dep("b")]},
            "single": {"deployments": [dep("c")]},
            "spare": {"deployments": [dep("d")]},
            "limited": {"deployments": [dep("e")]},  # its own upstream: a long Retry-After keeps it cool for long
        },
        "fallbacks": {"main": ["spare"], "single": ["spare"]},
        "router": {"num_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05, "max_retry_after_s": 1.5,
                   "cooldown_failures": 2, "cooldown_s": 3.0},
    }  # fmt: skip


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    fakes = {n: FakeUpstream(n) for n in "abcde"}
    upstreams = Servers()
    urls = dict(zip(fakes, upstreams.start([f.app() for f in fakes.values()]), strict=True))
    config = from_mapping(_config(urls))
    gateway = Servers()
    app = create_app(build_context(config, None, None))
    (url,) = gateway.start([app])
    yield Rig(fakes, url, app.state.router)
    gateway.stop()
    upstreams.stop()


@pytest.fixture()
def r(rig: Rig) -> Rig:
    rig.reset()
    return rig


def _ask(rig: Rig, model: str = "main", **kw: Any) -> Any:
    return rig.client().chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, **kw
    )


def _eventually(check: Callable[[], bool], seconds: float = 2.0) -> bool:
    """The router closes an attempt (success, failure, cooldown) just after the response is sent, so the client
    can read the answer a moment before the balancer's state and the metrics show it."""
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return check()


def test_a_500_is_retried_on_another_deployment(r: Rig) -> None:
    r.fakes["a"].play("500", default="ok")
    r.fakes["b"].play("500", default="ok")  # two failures, then the third attempt (num_retries 2) answers
    before = r.metric("smolgate_router_retries_total")
    raw = _ask(r)
    assert raw.parse().choices[0].message.content == "Hello from the fake upstream."
    assert raw.headers["x-smolgate-model"] == "main"
    assert r.fakes["a"].received + r.fakes["b"].received == 3
    assert r.metric("smolgate_router_retries_total") == before + 2
    assert r.fakes["a"].bodies[-1]["model"] == "up-a" and r.fakes["b"].bodies[-1]["model"] == "up-b"


def test_fallback_model_when_every_deployment_fails(r: Rig) -> None:
    r.fakes["a"].play(default="500")
    r.fakes["b"].play(default="500")
    raw = _ask(r, model="gpt-4o-mini")  # an alias of main
    assert raw.headers["x-smolgate-model"] == "spare"
    assert raw.parse().model == "up-d"
    assert r.metric('smolgate_router_fallbacks_total{fallback="spare",model="main"}') >= 1


def test_everything_failing_is_a_clear_error_not_a_hang(r: Rig) -> None:
    for name in "cd":
        r.fakes[name].play(default="500")
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        _ask(r, model="single")
    assert time.monotonic() - started < 10
    assert info.value.status_code == 503
    body = info.value.body
    assert isinstance(body, dict) and body["code"] == "all_deployments_failed"
    assert "single -> spare" in body["message"]


def test_cooldown_keeps_traffic_off_a_failing_deployment_then_probes_it(r: Rig) -> None:
    r.fakes["a"].play(default="500")
    for _ in range(40):  # ties between a and b break at random: go on until a has failed twice
        assert _ask(r).parse().choices[0].message.content
        if r.fakes["a"].received == 2:
            break
    assert r.fakes["a"].received == 2
    assert _eventually(lambda: r.metric('smolgate_router_cooldowns_total{deployment="a"') >= 1)
    for _ in range(6):
        assert _ask(r).parse().choices[0].message.content  # all answered by b
    assert r.fakes["a"].received == 2  # cooling down: not tried at all
    r.fakes["a"].play(default="ok")
    time.sleep(3.1)  # the cooldown ends: a request that lands there is a probe, and it succeeds
    for _ in range(40):
        _ask(r)
        if r.fakes["a"].received:
            break
    assert r.fakes["a"].received == 1
    assert _eventually(lambda: r.router.balancers["main"].states[0].cooldown_until == 0.0)  # closed again


def test_retry_after_is_honoured_then_answered(r: Rig) -> None:
    r.fakes["c"].play("429:1", default="ok")
    started = time.monotonic()
    raw = _ask(r, model="single")
    assert raw.headers["x-smolgate-model"] == "single"  # waited for c, did not fall back
    assert time.monotonic() - started >= 0.9
    assert r.fakes["c"].received == 2 and r.fakes["d"].received == 0


def test_a_long_retry_after_everywhere_is_a_429_with_retry_after(r: Rig) -> None:
    r.fakes["e"].play(default="429:30")
    with pytest.raises(openai.RateLimitError) as info:
        _ask(r, model="limited")
    assert info.value.response.headers["retry-after"] == "30"
    assert r.fakes["e"].received == 1
    with pytest.raises(openai.RateLimitError):
        _ask(r, model="limited")  # still cooling: refused without calling the upstream
    assert r.fakes["e"].received == 1


def test_a_hanging_upstream_times_out_and_the_other_answers(r: Rig) -> None:
    r.fakes["a"].play("hang", default="ok")
    r.fakes["b"].play("hang", default="ok")
    started = time.monotonic()
    assert _ask(r).parse().choices[0].message.content
    assert _ask(r, stream=True).parse() is not None
    assert time.monotonic() - started < 8


def test_a_stream_that_stalls_before_its_first_token_is_retried(r: Rig) -> None:
    r.fakes["c"].play("hang", default="ok")
    stream = r.client().chat.completions.create(
        model="single", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello from the fake upstream."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_a_stream_dropped_midway_ends_with_a_clear_error(r: Rig) -> None:
    r.fakes["c"].play("drop", default="ok")
    stream = r.client().chat.completions.create(model="single", messages=[{"role": "user", "content": "hi"}], stream=True)
    got = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got == ["Hello", " from"]
    assert "middle of the response" in info.value.message
    assert _ask(r, model="single").parse().choices  # the next request is fine


def test_usage_is_counted_when_the_upstream_omits_it(r: Rig) -> None:
    r.fakes["c"].play(default="ok_no_usage")
    usage = _ask(r, model="single").parse().usage
    assert usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0
    stream = r.client().chat.completions.create(
        model="single", messages=[{"role": "user", "content": "hi"}], stream=True, stream_options={"include_usage": True}
    )
    last = list(stream)[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens > 0


def test_a_bad_request_goes_back_to_the_client_unretried(r: Rig) -> None:
    r.fakes["c"].play(default="400")
    with pytest.raises(openai.BadRequestError) as info:
        _ask(r, model="single")
    assert "says the upstream" in info.value.message
    assert r.fakes["c"].received == 1 and r.fakes["d"].received == 0


def test_unknown_model_and_completions_endpoint(r: Rig) -> None:
    with pytest.raises(openai.NotFoundError):
        _ask(r, model="nope")
    out = r.client().completions.create(model="single", prompt="Say hi", max_tokens=4)
    assert out.choices[0].text == "Hello from the fake upstream."
    models = {m.id for m in r.client().models.list()}
    assert {"main", "single", "spare", "gpt-4o-mini"} <= models
