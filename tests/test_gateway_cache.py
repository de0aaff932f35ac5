"""The response cache through the real OpenAI SDK against live servers, the real engine and embedder,
and a real redis-server: exact and semantic hits, replay shapes, keys, policies, tenants, replicas,
Redis down, metrics and the access log."""

from __future__ import annotations

import time
import uuid
from typing import Any

import cache_fixtures
import httpx
import openai
import pytest
from cache_fixtures import OTHER_KEY, CacheStack
from gateway_fixtures import API_KEY, assert_completion_chunk, assert_schema

from kernels.cpu.build import c_kernels_unavailable

cache_stack = cache_fixtures.cache_stack

MAX = 6


def _ask(question: str, **kw: Any) -> dict[str, Any]:
    """A deterministic chat request (temperature 0): what the cache stores by default."""
    return {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}], "max_tokens": MAX,
            "temperature": 0, **kw}  # fmt: skip


def _unique(text: str) -> str:
    """A fresh question: the number keeps it from matching other tests' entries, even semantically."""
    return f"{text} (case {uuid.uuid4().int % 10**8})"


def _create(client: openai.OpenAI, **kw: Any) -> tuple[dict[str, Any], Any]:
    raw = client.chat.completions.with_raw_response.create(**kw)
    body = raw.http_response.json()
    assert_schema("CreateChatCompletionResponse", body)
    return body, raw.headers


def test_exact_hit_replays_the_answer_with_cached_usage(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = _ask(_unique("Name a color."))
    first, h1 = _create(client, **req)
    second, h2 = _create(client, **req)
    assert (h1["x-cache"], h2["x-cache"]) == ("miss", "hit")
    assert second["choices"] == first["choices"] and second["id"] != first["id"]
    assert second["usage"] == {**first["usage"], "cached": True}
    assert cache_stack.log_of(h2["x-request-id"])["cache"] == "hit"
    assert cache_stack.log_of(h1["x-request-id"])["cache"] == "miss"


def test_stream_replay_has_the_live_structure(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = _ask(_unique("Say something nice."), n=2)
    live = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **req))
    raw = client.chat.completions.with_raw_response.create(stream=True, stream_options={"include_usage": True}, **req)
    assert raw.headers["x-cache"] == "hit"
    replayed = list(raw.parse())
    for chunk in replayed:
        assert_schema("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
    assert len({c.id for c in replayed}) == 1 and replayed[0].choices[0].delta.role == "assistant"
    for index in (0, 1):
        deltas = [ch for c in replayed for ch in c.choices if ch.index == index]
        assert deltas[0].delta.role == "assistant"
        assert [d.finish_reason for d in deltas if d.finish_reason] == [d.finish_reason for c in live for d in c.choices
                                                                       if d.index == index and d.finish_reason]  # fmt: skip
        text = lambda chunks, i=index: "".join(d.delta.content or "" for c in chunks for d in c.choices if d.index == i)  # noqa: E731
        assert text(replayed) == text(live)
    assert replayed[-1].choices == [] and all(c.usage is None for c in replayed[:-1])
    assert replayed[-1].usage.completion_tokens == live[-1].usage.completion_tokens
    assert replayed[-1].usage.model_extra == {"cached": True}
    # and the streamed answer serves a JSON request too
    body, headers = _create(client, **req)
    assert headers["x-cache"] == "hit" and len(body["choices"]) == 2


def test_stream_without_usage_and_json_to_stream(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = _ask(_unique("Count to three."))
    body, _ = _create(client, **req)
    chunks = list(client.chat.completions.create(stream=True, **req))
    assert all(c.usage is None for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == body["choices"][0]["message"]["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == [body["choices"][0]["finish_reason"]]


@pytest.mark.parametrize(
    "change",
    [{"max_tokens": MAX - 1}, {"stop": ["zzz"]}, {"seed": 7}, {"presence_penalty": 0.5}, {"logit_bias": {"42": 1}},
     {"logprobs": True}, {"n": 2}, {"model": "SmolLM2-135M-Instruct", "top_p": 0.5}],
)  # fmt: skip
def test_every_output_parameter_is_in_the_key(cache_stack: CacheStack, change: dict[str, Any]) -> None:
    client = cache_stack.client()
    req = _ask(_unique("Pick a fruit."))
    _create(client, **req)
    _, headers = _create(client, **{**req, **change})
    assert headers["x-cache"] == "miss"


def test_alias_and_model_id_share_entries_and_system_prompt_counts(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = _ask(_unique("Pick an animal."))
    _create(client, **req)
    assert _create(client, **{**req, "model": "SmolLM2-135M-Instruct"})[1]["x-cache"] == "hit"
    system = [{"role": "system", "content": "Answer in French."}, *req["messages"]]
    assert _create(client, **{**req, "messages": system})[1]["x-cache"] == "miss"


def test_nondeterministic_requests_are_not_cached(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = {**_ask(_unique("Invent a word.")), "temperature": 0.9}
    _, h1 = _create(client, **req)
    _, h2 = _create(client, **req)
    assert (h1["x-cache"], h2["x-cache"]) == ("miss", "miss")
    assert cache_stack.log_of(h2["x-request-id"])["cache"] == "bypass"
    seeded = {**req, "seed": 3}
    assert [_create(client, **seeded)[1]["x-cache"] for _ in range(2)] == ["miss", "hit"]


def test_per_request_controls(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = _ask(_unique("Name a planet."))
    assert _create(client, **req, extra_body={"cache": {"store": False}})[1]["x-cache"] == "miss"
    assert _create(client, **req)[1]["x-cache"] == "miss"  # the first one was not stored
    assert _create(client, **req, extra_body={"cache": {"lookup": False}})[1]["x-cache"] == "miss"
    assert _create(client, **req, extra_headers={"x-smolgate-cache": "no-lookup"})[1]["x-cache"] == "miss"
    assert _create(client, **req)[1]["x-cache"] == "hit"
    short = _ask(_unique("Name a river."))
    _create(client, **short, extra_body={"cache": {"ttl": 1}})
    assert _create(client, **short)[1]["x-cache"] == "hit"
    time.sleep(1.1)
    assert _create(client, **short)[1]["x-cache"] == "miss"
    with pytest.raises(openai.BadRequestError, match="cache"):
        client.chat.completions.create(**req, extra_body={"cache": {"ttl": -1}})
    with pytest.raises(openai.BadRequestError, match="x-smolgate-cache"):
        client.chat.completions.create(**req, extra_headers={"x-smolgate-cache": "sometimes"})


def test_tenants_never_share_entries(cache_stack: CacheStack) -> None:
    req = _ask(_unique("Name a tree."))
    _create(cache_stack.client(key=API_KEY), **req)
    assert _create(cache_stack.client(key=OTHER_KEY), **req)[1]["x-cache"] == "miss"
    assert _create(cache_stack.client(key=API_KEY), **req)[1]["x-cache"] == "hit"


def _rejected(stack: CacheStack, reason: str) -> float:
    return stack.metric("memory", f'smolgate_cache_near_misses_total{{reason="{reason}"}}')


def test_semantic_hit_and_guarded_near_misses(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    system = {"role": "system", "content": _unique("You are a geography tutor.")}
    ask = lambda q: {**_ask(q), "messages": [system, {"role": "user", "content": q}]}  # noqa: E731
    original, _ = _create(client, **ask("What is the capital of France?"))
    guarded, close = _rejected(cache_stack, "guard"), _rejected(cache_stack, "threshold")
    body, headers = _create(client, **ask("What's the capital of France?"))
    assert headers["x-cache"] == "semantic-hit" and float(headers["x-cache-similarity"]) >= 0.86
    assert body["choices"] == original["choices"] and body["usage"]["cached"] is True
    assert cache_stack.log_of(headers["x-request-id"])["cache"] == "semantic-hit"
    # cosine 0.66 (not even near), 0.90 but a negation differs (guard), a number and a tense (near miss)
    others = ("What is the capital of Germany?", "What is not the capital of France?", "What was the capital of France in 1700?")
    for other in others:
        assert _create(client, **ask(other))[1]["x-cache"] == "miss"
    assert _rejected(cache_stack, "guard") >= guarded + 1
    assert _rejected(cache_stack, "guard") + _rejected(cache_stack, "threshold") >= guarded + close + 2
    # another system prompt, a conversation, or a tenant never matches semantically
    bare = [{"role": "user", "content": "What's the capital of France?"}]
    elsewhere = {**ask("x"), "messages": bare}
    assert _create(client, **elsewhere)[1]["x-cache"] == "miss"
    turns = [system, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "What's the capital of France?"}]  # fmt: skip
    assert _create(client, **{**ask("x"), "messages": turns})[1]["x-cache"] == "miss"
    assert _create(cache_stack.client(key=OTHER_KEY), **ask("What's the capital of France?"))[1]["x-cache"] == "miss"


def test_the_cache_embeds_with_its_own_copy_and_embeddings_keep_theirs(cache_stack: CacheStack) -> None:
    """cache.embedding_dtype auto: the semantic cache embeds with an int8 copy where the C kernels build (it shares the
    tokenizer, the engine's thread and the embedding tables); its vectors are what it stores; /v1/embeddings keeps
    embedding_dtype's encoder."""
    ctx = cache_stack.contexts["memory"]
    main, own = ctx.embedder, ctx.cache.embedder
    assert main is not None and own is not None
    if c_kernels_unavailable() is not None:
        assert own is main
        return
    assert own.dtype == "int8" and main.dtype in ("float16", "bfloat16") and own.identity.endswith("/int8")
    assert own.tokenizer is main.tokenizer and own._executor is main._executor is ctx.engine  # the engine's loop thread
    assert (own._encoder.word is main._encoder.word) == (main.dtype == "float16")  # fp32 activations: one table
    question = _unique("What is the tallest mountain in Africa?")
    _create(cache_stack.client(), **_ask(question))  # a miss: the answer and the question's vector are stored
    stored = cache_stack.memory_store.vectors[question]
    on_engine = lambda e: e._executor.submit(e.embed_sync, [question]).result()[0][0]  # noqa: E731 - as the cache runs it
    assert stored == on_engine(own) and stored != on_engine(main)
    resp = httpx.post(f"{cache_stack.urls['memory']}/v1/embeddings", headers={"authorization": f"Bearer {API_KEY}"},
                      json={"model": "all-MiniLM-L6-v2", "input": [question], "encoding_format": "float"})  # fmt: skip
    assert resp.json()["data"][0]["embedding"] == pytest.approx(on_engine(main), abs=1e-6)
    assert resp.json()["data"][0]["embedding"] != pytest.approx(stored, abs=1e-6)


def test_completions_exact_hit_json_and_stream(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    req = {"model": "gpt-3.5-turbo-instruct", "prompt": _unique("The sky is"), "max_tokens": MAX, "temperature": 0}
    first = client.completions.with_raw_response.create(**req)
    second = client.completions.with_raw_response.create(**req)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
    a, b = first.http_response.json(), second.http_response.json()
    assert_schema("CreateCompletionResponse", b)
    assert b["choices"] == a["choices"] and b["usage"]["cached"] is True
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **req))
    for chunk in chunks[:-1]:
        assert_completion_chunk(chunk.model_dump(exclude_unset=True))
    assert "".join(c.choices[0].text for c in chunks[:-1]) == a["choices"][0]["text"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == a["usage"]["completion_tokens"]
    # a live stream is stored too, and serves a JSON request
    other = {**req, "prompt": _unique("The sea is")}
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **other))
    again = client.completions.with_raw_response.create(**other)
    assert again.headers["x-cache"] == "hit" and again.http_response.json()["choices"][0]["text"] == streamed


def test_metrics_count_hits_and_tokens_saved(cache_stack: CacheStack) -> None:
    client = cache_stack.client()
    hits = cache_stack.metric("memory", 'smolgate_cache_lookups_total{endpoint="chat",result="hit"}')
    saved = cache_stack.metric("memory", 'smolgate_cache_tokens_saved_total{kind="completion"}')
    req = _ask(_unique("Name a metal."))
    body, _ = _create(client, **req)
    _create(client, **req)
    assert cache_stack.metric("memory", 'smolgate_cache_lookups_total{endpoint="chat",result="hit"}') == hits + 1
    now_saved = cache_stack.metric("memory", 'smolgate_cache_tokens_saved_total{kind="completion"}')
    assert now_saved == saved + body["usage"]["completion_tokens"]
    text = cache_stack.metrics("memory")
    for name in ("smolgate_cache_lookups_total", "smolgate_cache_near_misses_total", "smolgate_cache_stores_total"):
        assert name in text


def test_redis_replicas_share_exact_and_semantic_entries(cache_stack: CacheStack) -> None:
    one, two = cache_stack.client("redis1"), cache_stack.client("redis2")
    question = _unique("What is the capital of Italy?")
    body, h1 = _create(one, **_ask(question))
    _, h2 = _create(two, **_ask(question))
    assert (h1["x-cache"], h2["x-cache"]) == ("miss", "hit")
    paraphrase = question.replace("What is", "What's")
    replayed, h3 = _create(two, **_ask(paraphrase))
    assert h3["x-cache"] == "semantic-hit" and replayed["choices"] == body["choices"]
    assert _create(one, **_ask(question.replace("Italy", "Spain")))[1]["x-cache"] == "miss"


def test_redis_entries_expire_with_their_ttl(cache_stack: CacheStack) -> None:
    import redis

    assert cache_stack.redis is not None
    req = _ask(_unique("Name a mountain."))
    _create(cache_stack.client("redis1"), **req, extra_body={"cache": {"ttl": 120}})
    client = redis.Redis.from_url(cache_stack.redis.url)
    ttls = [client.ttl(key) for key in client.scan_iter(match="*:e:*")]
    client.close()
    assert ttls and all(0 < t <= 86400 for t in ttls) and any(t <= 120 for t in ttls)


def test_redis_down_requests_succeed_uncached(cache_stack: CacheStack) -> None:
    client = cache_stack.client("redis_down")
    req = _ask(_unique("Name a sea."))
    first, h1 = _create(client, **req)
    second, h2 = _create(client, **req)
    assert (h1["x-cache"], h2["x-cache"]) == ("miss", "miss")
    assert first["choices"] == second["choices"]
    assert cache_stack.metric("redis_down", 'smolgate_cache_backend_errors_total{op="get"}') >= 2
    warnings = [x for x in cache_stack.log_lines() if x.get("event") == "cache_backend_unavailable"]
    assert warnings and warnings[0]["level"] == "warning"
    assert httpx.get(f"{cache_stack.urls['redis_down']}/ready").status_code == 200


def test_a_replica_that_joins_sees_earlier_entries(cache_stack: CacheStack) -> None:
    """Store-level: a RedisStore created after the writes (a new replica) finds entries and vectors."""
    import asyncio

    from gateway.cache.redis_store import RedisStore

    if cache_stack.redis is None:
        pytest.skip(cache_fixtures.REDIS_SKIP)
    url, prefix = cache_stack.redis.url, f"join{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        writer = RedisStore(url, prefix, max_entries=100, timeout_s=1.0)
        for i in range(30):
            await writer.put(f"k{i}", f"answer {i}".encode(), 60)
            await writer.add_vector("scope", f"k{i}", f"question {i}", [1.0 if j == i else 0.0 for j in range(32)], ttl_s=60)
        await writer.close()
        joiner = RedisStore(url, prefix, max_entries=100, timeout_s=1.0)
        found = await joiner.search("scope", [1.0 if j == 7 else 0.0 for j in range(32)], 3, 0.5)
        assert [c.key for c in found] == ["k7"] and found[0].text == "question 7"
        assert await joiner.get("k7") == b"answer 7"
        await joiner.close()

    asyncio.run(run())
