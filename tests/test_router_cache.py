"""The response cache for routed models that a third-party API serves (gateway/routing/cached.py): a real router
process-in-a-thread (no engine) in front of a real OpenAI-compatible server with the real model (the live test
gateway, reached as a deployment of kind `openai`), driven with the openai SDK. Upstream calls are counted in the
upstream's own access log (each request tagged with a `user` of its own, which is not part of the cache key)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from gateway_fixtures import API_KEY, LiveStack, live  # noqa: F401 - the session fixture
from routing_fixtures import FakeUpstream, Servers

from backend.embed.embeddings import Embedder
from gateway.app import build_context, create_app
from gateway.config import from_mapping

KEYS = ("sk-tenant-a", "sk-tenant-b", "sk-only-other")


@dataclass
class Router:
    url: str
    upstream: LiveStack

    def client(self, key: str = KEYS[0]) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

    def upstream_calls(self, user: str) -> int:
        deadline = time.monotonic() + 5
        while True:  # the upstream writes its line just after answering
            n = sum(1 for line in self.upstream.log_lines() if line.get("event") == "request" and line.get("user") == user)
            if n or time.monotonic() > deadline:
                return n
            time.sleep(0.02)


@pytest.fixture(scope="module")
def router(live: LiveStack) -> Iterator[Router]:  # noqa: F811
    model = live.engine.model_name
    config = from_mapping({
        "api_keys": [{"key": KEYS[0]}, {"key": KEYS[1]}, {"key": KEYS[2], "models": ["other"]}],
        "cache": {"semantic": True},
        "models": {
            "theirs": {"deployments": [{"kind": "openai", "base_url": f"{live.url}/v1", "model": model,
                                        "api_key_env": "UPSTREAM_KEY"}]},
            "other": {"deployments": [{"kind": "openai", "base_url": f"{live.url}/v1", "model": model,
                                       "api_key_env": "UPSTREAM_KEY"}]},
            "down": {"deployments": [{"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "connect_timeout_s": 0.5}]},
        },
        "fallbacks": {"down": ["other"]},
        "router": {"num_retries": 0},
    }, env={"UPSTREAM_KEY": API_KEY})  # fmt: skip
    servers = Servers()
    (url,) = servers.start([create_app(build_context(config, None, Embedder()))])
    try:
        yield Router(url, live)
    finally:
        servers.stop()


def _ask(client: openai.OpenAI, question: str, user: str, **kw: Any) -> tuple[str, str | None]:
    raw = client.chat.completions.with_raw_response.create(
        model=kw.pop("model", "theirs"), messages=[{"role": "user", "content": question}], temperature=0, max_tokens=12,
        user=user, **kw,
    )
    if kw.get("stream"):
        text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    else:
        text = raw.parse().choices[0].message.content or ""
    return text, raw.headers.get("x-cache")


def test_a_third_party_models_answer_is_served_again_to_its_tenant_only(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"What is {uuid.uuid4().int % 1000} plus two?"
    first, verdict = _ask(router.client(), question, user)
    assert verdict == "miss" and first and router.upstream_calls(user) == 1
    again, verdict = _ask(router.client(), question, user)
    assert (again, verdict) == (first, "hit")
    streamed, verdict = _ask(router.client(), question, user, stream=True)  # a JSON answer replayed as a stream
    assert (streamed, verdict) == (first, "hit")
    assert router.upstream_calls(user) == 1  # neither reached the provider
    # another tenant asking the very same question goes to the provider: entries are per key
    _, verdict = _ask(router.client(KEYS[1]), question, user)
    assert verdict == "miss" and router.upstream_calls(user) == 2
    # a key that may not use the model gets no answer, cached or not
    with pytest.raises(openai.NotFoundError):
        _ask(router.client(KEYS[2]), question, user)


def test_a_streamed_answer_is_kept_and_served_as_json(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"Name a colour, any colour, number {uuid.uuid4().int % 1000}."
    streamed, verdict = _ask(router.client(), question, user, stream=True, stream_options={"include_usage": True})
    assert verdict == "miss" and streamed
    text, verdict = _ask(router.client(), question, user)
    assert (text, verdict) == (streamed, "hit") and router.upstream_calls(user) == 1


def test_paraphrases_hit_by_the_lexical_check_and_look_alikes_do_not(router: Router) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    first, verdict = _ask(router.client(), "what is the capital city of portugal", user)
    assert verdict == "miss"
    text, verdict = _ask(router.client(), "What's the capital city of Portugal?", user)
    assert (text, verdict) == (first, "semantic-hit")
    _, verdict = _ask(router.client(), "what is the capital city of spain", user)  # a sibling: never served
    assert verdict == "miss" and router.upstream_calls(user) == 2


def test_a_fallback_models_answer_is_not_kept_for_the_model_that_failed(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"Say the number {uuid.uuid4().int % 1000}."
    for _ in range(2):
        _, verdict = _ask(router.client(), question, user, model="down")
        assert verdict == "miss"  # answered by `other` each time: never stored under `down`
    assert router.upstream_calls(user) == 2


def test_the_cache_extension_never_reaches_the_provider_and_is_obeyed() -> None:
    """A stand-in upstream that records what it receives (it isolates what the router forwards)."""
    fake = FakeUpstream("theirs")
    upstreams = Servers()
    (up,) = upstreams.start([fake.app()])
    config = from_mapping({"embeddings": False,
                           "models": {"theirs": {"deployments": [{"kind": "openai", "base_url": f"{up}/v1"}]}}})  # fmt: skip
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, None))])
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        messages = [{"role": "user", "content": "Hi"}]
        verdicts = []
        for extension in ({"store": False}, None, None, {"lookup": False}):
            extra = {"extra_body": {"cache": extension}} if extension else {}
            raw = client.chat.completions.with_raw_response.create(model="theirs", messages=messages, temperature=0, **extra)
            verdicts.append(raw.headers.get("x-cache"))
        assert verdicts == ["miss", "miss", "hit", "miss"]
        assert fake.received == 3 and all("cache" not in body for body in fake.bodies)
    finally:
        gateway.stop()
        upstreams.stop()


def _verifications(ctx: Any, outcome: str) -> float:
    return ctx.metrics.registry.get_sample_value("smolgate_cache_verifications_total", {"outcome": outcome}) or 0.0


def test_sampled_hits_go_to_the_provider_and_an_entry_that_disagreed_is_not_served_again(live: LiveStack) -> None:  # noqa: F811
    """`cache.upstream_sample: 1`: every hit the words allow is sent to the provider and the answers are compared. The
    agreement is forced to fail here (a fault injected into the check), to show what a disagreement does."""
    config = from_mapping({
        "cache": {"semantic": True, "upstream_sample": 1.0},
        "models": {"theirs": {"deployments": [{"kind": "openai", "base_url": f"{live.url}/v1",
                                               "model": live.engine.model_name, "api_key_env": "UPSTREAM_KEY"}]}},
    }, env={"UPSTREAM_KEY": API_KEY})  # fmt: skip
    ctx = build_context(config, None, Embedder())
    assert ctx.cache.upstream_check is not None and ctx.cache.sampled is None  # the embedded model's stay the engine's
    servers = Servers()
    (url,) = servers.start([create_app(ctx)])
    router = Router(url, live)
    try:
        user = f"u-{uuid.uuid4().hex[:8]}"
        client = router.client("anyone")
        assert _ask(client, "how many legs does a spider have", user)[1] == "miss"
        # the paraphrase would be a semantic hit: sampled, it goes to the provider (not stored, to ask it again below)
        ctx.cache.upstream_check.agreement = 2.0  # no two answers agree
        _, verdict = _ask(client, "How many legs does a spider have?", user, extra_body={"cache": {"store": False}})
        assert verdict == "miss" and router.upstream_calls(user) == 2
        assert (_verifications(ctx, "sample"), _verifications(ctx, "disagreed")) == (1, 1)
        ctx.cache.upstream_check.rate = 0.0  # no more sampling: only the recorded disagreement decides now
        _, verdict = _ask(client, "How many legs does a spider have?", user)
        assert verdict == "miss" and router.upstream_calls(user) == 3 and _verifications(ctx, "blocked") == 1
        # agreement: the hit would have been right, and the entry stays servable
        ctx.cache.upstream_check.agreement, ctx.cache.upstream_check.rate = -1.0, 1.0
        assert _ask(client, "what is the boiling point of water", user)[1] == "miss"
        assert _ask(client, "What's the boiling point of water?", user)[1] == "miss"
        assert _verifications(ctx, "agreed") == 1 and router.upstream_calls(user) == 5
    finally:
        servers.stop()
