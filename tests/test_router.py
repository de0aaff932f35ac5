"""gateway/routing/router.py end to end: `model: auto` (header and metrics), API-key policies (allowed models, a key's rpm),
and a deployment of kind embedded — the real engine in this process — as a model and as a fallback for a failing
upstream (tests/routing_fixtures.py's fake upstream)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import gateway_test_config
from routing_fixtures import FakeUpstream, Servers

from gateway.app import build_context, create_app
from gateway.config import from_mapping

KEY, NARROW = "sk-router-all", "sk-router-narrow"


@dataclass
class Rig:
    fakes: dict[str, FakeUpstream]
    url: str

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

    def metric(self, prefix: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))


def _config(urls: dict[str, str]) -> dict[str, Any]:
    def dep(name: str) -> dict[str, Any]:
        return {"kind": "openai", "name": name, "base_url": f"{urls[name]}/v1", "timeout_s": 2.0}

    return {
        "api_keys": [KEY, {"key": NARROW, "name": "narrow", "models": ["small", "auto"], "rpm": 3}],
        "admin_keys": [KEY],
        "embeddings": False,
        "cache": {"backend": "off"},
        "models": {
            "small": {"deployments": [dep("s")]},
            "large": {"deployments": [dep("l")]},
            "local": {"deployments": [{"kind": "embedded"}]},
            "flaky": {"deployments": [dep("f")]},
        },
        "fallbacks": {"flaky": ["local"]},
        "auto": {"small": "small", "large": "large", "threshold": 0.4},
        "router": {"backoff_base_s": 0.01, "cooldown_failures": 1, "cooldown_s": 30.0},
    }


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    from backend.engine.async_engine import AsyncEngine

    fakes = {n: FakeUpstream(n) for n in "slf"}
    upstreams = Servers()
    urls = dict(zip(fakes, upstreams.start([f.app() for f in fakes.values()]), strict=True))
    config = replace(from_mapping(_config(urls)), engine=gateway_test_config().engine)
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, AsyncEngine.from_config(config.engine), None))])
    yield Rig(fakes, url)
    gateway.stop()
    upstreams.stop()


def _ask(rig: Rig, model: str, content: str, key: str = KEY, **kw: Any) -> Any:
    return rig.client(key).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=8, temperature=0, **kw
    )


def test_auto_picks_small_or_large_and_says_so(rig: Rig) -> None:
    easy = _ask(rig, "auto", "Hi!")
    assert easy.headers["x-smolgate-auto-tier"] == "small" and easy.headers["x-smolgate-model"] == "small"
    hard = _ask(rig, "auto", "Prove step by step that the algorithm's complexity is O(n log n), then derive the integral of x^2.")
    assert hard.headers["x-smolgate-auto-tier"] == "large" and hard.headers["x-smolgate-model"] == "large"
    assert float(hard.headers["x-smolgate-auto-score"]) > float(easy.headers["x-smolgate-auto-score"])
    assert rig.metric('smolgate_router_auto_choices_total{model="large",tier="large"}') >= 1
    assert rig.metric('smolgate_router_auto_choices_total{model="small",tier="small"}') >= 1


def test_a_keys_models_and_rpm(rig: Rig) -> None:
    with pytest.raises(openai.NotFoundError):
        _ask(rig, "large", "Hi", key=NARROW)
    _ask(rig, "small", "Hi", key=NARROW)
    _ask(rig, "auto", "Hi", key=NARROW)
    _ask(rig, "small", "Hi", key=NARROW)
    with pytest.raises(openai.RateLimitError) as info:
        _ask(rig, "small", "Hi", key=NARROW)
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 60
    assert "API key" in info.value.message
    _ask(rig, "small", "Hi")  # another key is not limited


def test_an_embedded_deployment_serves_through_the_router(rig: Rig) -> None:
    raw = _ask(rig, "local", "What is 2+2?")
    out = raw.parse()
    assert raw.headers["x-smolgate-deployment"] == "embedded" and out.model == "local"
    assert out.choices[0].message.content and out.usage is not None and out.usage.completion_tokens > 0
    stream = rig.client().chat.completions.create(
        model="local", messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=8, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == out.choices[0].message.content


def test_a_failing_upstream_falls_back_to_the_embedded_engine(rig: Rig) -> None:
    rig.fakes["f"].play(default="500")
    raw = _ask(rig, "flaky", "Say hi.")
    assert raw.headers["x-smolgate-model"] == "local" and raw.parse().choices[0].message.content
    assert rig.fakes["f"].received >= 1
