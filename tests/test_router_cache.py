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

import httpx
import openai
import pytest
from gateway_fixtures import API_KEY, LiveStack, live  # noqa: F401 - the session fixture
from routing_fixtures import WORDS, FakeUpstream, Servers

from backend.embed.embeddings import Embedder
from gateway.app import build_context, create_app
from gateway.config import from_mapping

KEYS = ("sk-tenant-a", "sk-tenant-b", "sk-only-other", "sk-two-a-minute")


@dataclass
class Router:
    url: str
    upstream: LiveStack

    def client(self, key: str = KEYS[0]) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

    def upstream_calls(self, user: str, expected: int) -> int:
        """The requests the provider logged for `user`, once `expected` of them are there (or 5 s passed): the
        upstream writes each line just after answering, so the last one may still be on its way."""
        deadline = time.monotonic() + 5
        while True:
            n = sum(1 for line in self.upstream.log_lines() if line.get("event") == "request" and line.get("user") == user)
            if n >= expected or time.monotonic() > deadline:
                return n
            time.sleep(0.02)


@pytest.fixture(scope="module")
def router(live: LiveStack) -> Iterator[Router]:  # noqa: F811
    model = live.engine.model_name
    config = from_mapping({
        "api_keys": [{"key": KEYS[0]}, {"key": KEYS[1]}, {"key": KEYS[2], "models": ["other"]},
                     {"key": KEYS[3], "rpm": 2, "max_tokens": 8}],
        "cache": {"semantic": True, "upstream": True},
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
    kw.setdefault("max_tokens", 12)
    raw = client.chat.completions.with_raw_response.create(
        model=kw.pop("model", "theirs"), messages=[{"role": "user", "content": question}], temperature=0, user=user, **kw
    )
    if kw.get("stream"):
        text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
    else:
        text = raw.parse().choices[0].message.content or ""
    return text, raw.headers.get("x-cache")


def test_a_third_party_models_answer_is_served_again_to_its_tenant_only(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"What is {uuid.uuid4().int % 1000} plus two?"
    first, verdict = _ask(router.client(), question, user)
    assert verdict == "miss" and first and router.upstream_calls(user, 1) == 1
    again, verdict = _ask(router.client(), question, user)
    assert (again, verdict) == (first, "hit")
    streamed, verdict = _ask(router.client(), question, user, stream=True)  # a JSON answer replayed as a stream
    assert (streamed, verdict) == (first, "hit")
    assert router.upstream_calls(user, 1) == 1  # neither reached the provider
    # another tenant asking the very same question goes to the provider: entries are per key
    _, verdict = _ask(router.client(KEYS[1]), question, user)
    assert verdict == "miss" and router.upstream_calls(user, 2) == 2
    # a key that may not use the model gets no answer, cached or not
    with pytest.raises(openai.NotFoundError):
        _ask(router.client(KEYS[2]), question, user)


def test_a_streamed_answer_is_kept_and_served_as_json(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"Name a colour, any colour, number {uuid.uuid4().int % 1000}."
    streamed, verdict = _ask(router.client(), question, user, stream=True, stream_options={"include_usage": True})
    assert verdict == "miss" and streamed
    text, verdict = _ask(router.client(), question, user)
    assert (text, verdict) == (streamed, "hit") and router.upstream_calls(user, 1) == 1


def test_paraphrases_hit_by_the_lexical_check_and_look_alikes_do_not(router: Router) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    first, verdict = _ask(router.client(), "what is the capital city of portugal", user)
    assert verdict == "miss"
    text, verdict = _ask(router.client(), "What's the capital city of Portugal?", user)
    assert (text, verdict) == (first, "semantic-hit")
    _, verdict = _ask(router.client(), "what is the capital city of spain", user)  # a sibling: never served
    assert verdict == "miss" and router.upstream_calls(user, 2) == 2


def test_a_fallback_models_answer_is_not_kept_for_the_model_that_failed(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"Say the number {uuid.uuid4().int % 1000}."
    for _ in range(2):
        _, verdict = _ask(router.client(), question, user, model="down")
        assert verdict == "miss"  # answered by `other` each time: never stored under `down`
    assert router.upstream_calls(user, 2) == 2


def test_a_hit_counts_against_the_keys_rate_and_its_caps_hold(router: Router) -> None:
    user, question = f"u-{uuid.uuid4().hex[:8]}", f"Count to {uuid.uuid4().int % 1000}."
    client = router.client(KEYS[3])  # 2 requests a minute, max_tokens 8 at most
    with pytest.raises(openai.BadRequestError):
        _ask(client, question, user, max_tokens=100)  # over the key's cap: refused before any lookup
    assert _ask(client, question, user, max_tokens=8)[1] == "miss"
    assert _ask(client, question, user, max_tokens=8)[1] == "hit"
    with pytest.raises(openai.RateLimitError):
        _ask(client, question, user, max_tokens=8)  # the third request this minute, though it would be a hit
    assert router.upstream_calls(user, 1) == 1


def test_anthropic_messages_reach_the_same_cache(router: Router) -> None:
    body = {"model": "theirs", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": f"Spell the word {uuid.uuid4().hex[:6]}."}]}  # fmt: skip
    verdicts = []
    for key in (KEYS[0], KEYS[0], KEYS[1]):
        resp = httpx.post(f"{router.url}/v1/messages", json=body, headers={"x-api-key": key}, timeout=120)
        assert resp.status_code == 200, resp.text
        verdicts.append(resp.headers.get("x-cache"))
    assert verdicts == ["miss", "hit", "miss"]


@pytest.fixture()
def fake_router() -> Iterator[tuple[FakeUpstream, openai.OpenAI]]:
    """A stand-in upstream that records what it receives and misbehaves on cue (it isolates what the router forwards
    and keeps), behind a router caching third-party models, with a mixed model (openai + backend) beside it."""
    fake = FakeUpstream("theirs")
    upstreams = Servers()
    (up,) = upstreams.start([fake.app()])
    config = from_mapping({"embeddings": False, "cache": {"upstream": True}, "models": {
        "theirs": {"deployments": [{"kind": "openai", "base_url": f"{up}/v1"}]},
        "mixed": {"deployments": [{"kind": "openai", "base_url": f"{up}/v1"},
                                  {"kind": "backend", "base_url": "http://127.0.0.1:9/v1", "weight": 0.001}]},
    }})  # fmt: skip
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, None))])
    try:
        yield fake, openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    finally:
        gateway.stop()
        upstreams.stop()


def _chat(client: openai.OpenAI, model: str = "theirs", **kw: Any) -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Hi"}], temperature=0, **kw
    )


def test_the_cache_extension_never_reaches_the_provider_and_is_obeyed(fake_router: Any) -> None:
    fake, client = fake_router
    verdicts = []
    for extension in ({"store": False}, None, None, {"lookup": False}):
        verdicts.append(_chat(client, extra_body={"cache": extension} if extension else None).headers.get("x-cache"))
    assert verdicts == ["miss", "miss", "hit", "miss"] and fake.received == 3
    _chat(client, "mixed", extra_body={"cache": {"store": False}})  # not cached here: still never forwarded
    assert fake.received == 4 and all("cache" not in body for body in fake.bodies)


def test_what_the_parser_refuses_goes_to_the_provider_uncached(fake_router: Any) -> None:
    fake, client = fake_router
    for _ in range(2):
        raw = _chat(client, top_p=0)  # OpenAI takes it; this gateway's own engine would not
        assert raw.status_code == 200 and "x-cache" not in raw.headers
    assert fake.received == 2 and fake.bodies[-1]["top_p"] == 0


def test_a_loose_answer_is_kept_in_the_replayed_shape_and_a_tool_call_is_not_kept(fake_router: Any) -> None:
    fake, client = fake_router
    fake.play("odd", "tool", "tool")
    assert _chat(client, seed=1).headers["x-cache"] == "miss"
    replayed = _chat(client, seed=1)
    assert replayed.headers["x-cache"] == "hit" and replayed.parse().choices[0].message.content == "".join(WORDS)
    streamed = _chat(client, seed=1, stream=True, stream_options={"include_usage": True})
    chunks = list(streamed.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "".join(WORDS)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 0  # the provider gave no count
    for _ in range(2):  # a tool call is relayed, never kept
        raw = _chat(client, seed=2)
        assert raw.headers["x-cache"] == "miss" and raw.parse().choices[0].message.tool_calls
    assert fake.received == 3


def test_third_party_models_are_not_cached_by_default() -> None:
    fake = FakeUpstream("theirs")
    upstreams = Servers()
    (up,) = upstreams.start([fake.app()])
    config = from_mapping({"embeddings": False, "models": {"theirs": {"deployments": [
        {"kind": "openai", "base_url": f"{up}/v1"}]}}})  # fmt: skip
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, None))])
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        assert [_chat(client).headers.get("x-cache") for _ in range(2)] == [None, None] and fake.received == 2
    finally:
        gateway.stop()
        upstreams.stop()


def _verifications(ctx: Any, outcome: str) -> float:
    return ctx.metrics.registry.get_sample_value("smolgate_cache_verifications_total", {"outcome": outcome}) or 0.0


def test_sampled_hits_go_to_the_provider_and_an_entry_that_disagreed_is_not_served_again(live: LiveStack) -> None:  # noqa: F811
    """`cache.upstream_sample: 1`: every hit the words allow is sent to the provider and the answers are compared. The
    agreement is forced to fail here (a fault injected into the check), to show what a disagreement does."""
    config = from_mapping({
        "cache": {"semantic": True, "upstream": True, "upstream_sample": 1.0},
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
        assert verdict == "miss" and router.upstream_calls(user, 2) == 2
        assert (_verifications(ctx, "sample"), _verifications(ctx, "disagreed")) == (1, 1)
        ctx.cache.upstream_check.rate = 0.0  # no more sampling: only the recorded disagreement decides now
        _, verdict = _ask(client, "How many legs does a spider have?", user)
        assert verdict == "miss" and router.upstream_calls(user, 3) == 3 and _verifications(ctx, "blocked") == 1
        # agreement: the hit would have been right, and the entry stays servable
        ctx.cache.upstream_check.agreement, ctx.cache.upstream_check.rate = -1.0, 1.0
        assert _ask(client, "what is the boiling point of water", user)[1] == "miss"
        no_store = {"extra_body": {"cache": {"store": False}}}
        assert _ask(client, "What's the boiling point of water?", user, **no_store)[1] == "miss"
        assert _verifications(ctx, "agreed") == 1 and router.upstream_calls(user, 5) == 5
        ctx.cache.upstream_check.rate = 0.0
        assert _ask(client, "What's the boiling point of water?", user)[1] == "semantic-hit"
    finally:
        servers.stop()
