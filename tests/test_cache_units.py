"""Response-cache parts without a server: the labelled paraphrase / hard-negative set scored with the
real embedder at the default threshold, key-term guards, the LRU store, controls and configuration."""

from __future__ import annotations

import asyncio
from functools import cache
from pathlib import Path

import pytest

from backend.engine.sampling_params import SamplingParams
from bench.cache_pairs import PairScore, load_pairs, score_with
from gateway.cache import lexical
from gateway.cache.config import CacheConfig
from gateway.cache.guards import same_key_terms
from gateway.cache.keys import exact_key, namespace, semantic_scope
from gateway.cache.policy import CacheControl, from_body, from_header, semantic_allowed
from gateway.cache.replay import replayable
from gateway.cache.stores import MemoryStore
from gateway.config import ConfigError, load_config
from gateway.errors import InvalidRequest


@cache
def _score() -> PairScore:
    from backend.embed.embeddings import Embedder, for_cache

    cfg = CacheConfig()  # the cache's own embedder (int8 where the C kernels build), as the gateway builds it
    return score_with(for_cache(Embedder(batch_size=256), cfg.embedding_dtype).embed_sync, cfg.similarity_threshold)


def test_labelled_set_is_large_and_balanced() -> None:
    pairs = load_pairs()
    kinds = {p.kind for p in pairs if p.label == "negative"}
    assert len(pairs) >= 200 and {"number", "entity", "negation"} <= kinds
    assert sum(p.label == "paraphrase" for p in pairs) >= 100 and sum(p.label == "negative" for p in pairs) >= 100


def test_lexical_mode_hits_paraphrases_and_never_hard_negatives() -> None:
    """The matcher without the engine verifier (cosine + guards + the lexical check, content words in order), at the
    default threshold, on the old labelled set (the verified mode is measured on the dev/test splits, bench.cache)."""
    score = _score()
    assert score.false_hit_rate <= 0.01, score.false_examples
    assert score.paraphrase_hit_rate >= 0.45, score.missed_examples


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the capital of France?", "What is the capital of Germany?"),
        ("what is the capital of france", "what is the capital of germany"),
        ("What is 2+3?", "What is 2+4?"),
        ("What is 10 divided by 2?", "What is 2 divided by 10?"),
        ("What is the largest ocean?", "What is the smallest ocean?"),
        ("What is the hottest planet?", "what is the coldest planet"),
        ("Give me three tips.", "Give me five tips."),
    ],
)
def test_guards_reject_classic_false_hits(a: str, b: str) -> None:
    assert not same_key_terms(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Is coffee good for you?", "Is coffee not good for you?"),
        ("Why do penguins fly?", "Why don't penguins fly?"),
        ("hi, if you dont mind: why do penguins fly?", "why dont penguins fly"),
    ],
)
def test_negations_are_read_after_the_courtesies(a: str, b: str) -> None:
    """Negations are the lexical check's: it reads them once greetings and "if you don't mind" are dropped."""
    assert same_key_terms(a, b)
    assert lexical.compare(a, b) == lexical.DIFFERENT


def test_a_polarity_word_on_one_side_is_left_to_the_lexical_check() -> None:
    assert same_key_terms("how do i boost my credit score", "how do i increase my credit score")
    assert same_key_terms("What is the Pythagorean theorem?", "what's the pythagorean theorem")  # names, any case
    assert not same_key_terms("flights to Paris", "flights to Rome")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the capital of France?", "Tell me France's capital."),
        ("Give me three tips.", "Give me 3 tips."),
        ("Why don't penguins fly?", "Why can't penguins fly?"),
        ("How do I reverse a list in Python?", "How can I reverse a Python list?"),
    ],
)
def test_guards_keep_paraphrases(a: str, b: str) -> None:
    assert same_key_terms(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("How do I right-click on a MacBook trackpad?", "how do u right click on macbook trackpad"),  # a hyphen joins
        ("can i return something to amazon without the box", "can u return stuff to amazon w/o the box"),
        ("How do I add speaker notes in PowerPoint?", "powerpoint add speaker notes"),  # "add": no number near
        ("how to get over jet lag quickly", "tips for getting over jet lag"),
        ("Can you explain Newton's third law?", "newtons 3rd law pls explain"),  # an ordinal, either spelling
        ("how long do car batteries usually last", "how long does a car battery last for"),  # "last": the verb
        ("Who was the first king of England?", "Who was England's first king?"),  # names in any order
        ("how do i make fluffy pancakes", "how 2 make fluffy pancakes"),
        ("which smartwatch has the best battery life", "which smartwatch has the longest battery life"),  # two scales
    ],
)
def test_guards_leave_rewordings_to_the_lexical_check(a: str, b: str) -> None:
    assert same_key_terms(a, b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("what is 5 plus 3", "what is 5 minus 3"),  # operator words next to numbers
        ("what is 7 - 3", "what is 7 + 3"),
        ("what was the last album they released", "what was the first album they released"),
        ("how many miles is a marathon", "how many kilometers is a marathon"),  # one scale, two poles
        ("Give me the 3rd item", "Give me the 4th item"),
    ],
)
def test_guards_still_tell_numbers_operators_and_poles_apart(a: str, b: str) -> None:
    assert not same_key_terms(a, b)


def test_memory_store_is_an_lru_with_ttls() -> None:
    now = [0.0]
    store = MemoryStore(max_entries=2, clock=lambda: now[0])

    async def run() -> None:
        await store.put("a", b"1", 10)
        await store.put("b", b"2", 10)
        await store.add_vector("s", "a", "question a", [1.0, 0.0], ttl_s=10)
        assert await store.get("a") == b"1"  # a is now the most recent
        await store.put("c", b"3", 10)  # evicts b
        assert (await store.get("b"), len(store)) == (None, 2)
        assert [c.key for c in await store.search("s", [1.0, 0.0], 4, 0.5)] == ["a"]
        now[0] = 11.0
        assert await store.get("a") is None  # expired, and its vector is gone with it
        assert await store.search("s", [1.0, 0.0], 4, 0.5) == []

    asyncio.run(run())


def test_keys_separate_tenants_and_parameters() -> None:
    params = SamplingParams(temperature=0.0, max_tokens=8)
    key = lambda ns, p, body: exact_key(  # noqa: E731
        ns, "fp", "chat", body, params=p, prompt=[{"role": "user", "content": "hi"}], prompt_ids=[1, 2])
    base = key(namespace("Bearer a"), params, {"model": "gpt-4o-mini", "stream": True})
    assert base == key(namespace("Bearer a"), params, {"model": "other-alias", "user": "u1"})
    assert base != key(namespace("Bearer b"), params, {})
    assert base != key(namespace("Bearer a"), SamplingParams(temperature=0.0, max_tokens=9), {})
    assert base != key(namespace("Bearer a"), params, {"response_format": {"type": "json_object"}})


def test_semantic_scopes_separate_embedders() -> None:
    """A Redis cache may be shared by replicas that embed in other dtypes: their vectors never meet."""
    params, ctx = SamplingParams(temperature=0.0), [{"role": "system", "content": "Be brief."}]
    scope = lambda embedder: semantic_scope("ns", "fp", embedder, "chat", body={}, params=params, context=ctx)  # noqa: E731
    assert scope("all-MiniLM-L6-v2/int8") == scope("all-MiniLM-L6-v2/int8") != scope("all-MiniLM-L6-v2/float16")


def test_request_controls() -> None:
    assert from_body(None, 100) == CacheControl()
    assert from_body({"lookup": False, "ttl": 500}, 100) == CacheControl(lookup=False, ttl_s=100)
    assert from_header("no-store, ttl=5", CacheControl(), 100) == CacheControl(store=False, ttl_s=5)
    with pytest.raises(InvalidRequest):
        from_body({"lookup": "no"}, 100)
    with pytest.raises(InvalidRequest):
        from_body({"forever": True}, 100)


def test_cache_configuration_from_yaml_and_env(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("cache: {backend: redis, redis_url: 'redis://cache:6379/1', similarity_threshold: 0.9}\n")
    cfg = load_config(path, environ={"SMOLGATE_CACHE_TTL_S": "60"})
    assert (cfg.cache.backend, cfg.cache.redis_url, cfg.cache.similarity_threshold, cfg.cache.ttl_s) == (
        "redis", "redis://cache:6379/1", 0.9, 60,
    )  # fmt: skip
    assert load_config(None, environ={"SMOLGATE_CACHE_BACKEND": "off"}).cache.enabled is False
    path.write_text("cache: {backend: memcached}\n")
    with pytest.raises(ConfigError, match=r"cache\.backend"):
        load_config(path, environ={})
    path.write_text("cache: {size: 3}\n")
    with pytest.raises(ConfigError, match="unknown cache config keys"):
        load_config(path, environ={})
    assert load_config(None, environ={}).cache.embedding_dtype == "auto"
    path.write_text("cache: {embedding_dtype: same}\n")
    assert load_config(path, environ={}).cache.embedding_dtype == "same"
    assert load_config(path, environ={"SMOLGATE_CACHE_EMBEDDING_DTYPE": "int8"}).cache.embedding_dtype == "int8"
    with pytest.raises(ConfigError, match=r"cache\.embedding_dtype"):
        load_config(None, environ={"SMOLGATE_CACHE_EMBEDDING_DTYPE": "int4"})


def test_semantic_matching_is_off_by_default_and_opt_in() -> None:
    """Exact caching stays on; paraphrase matching needs `cache.semantic: true` (docs/caching.md)."""
    default = load_config(None, environ={}).cache
    assert default.enabled and not default.semantic
    assert not semantic_allowed(default, {}, [{"role": "user", "content": "hi"}], SamplingParams(temperature=0.0))
    assert load_config(None, environ={"SMOLGATE_CACHE_SEMANTIC": "true"}).cache.semantic is True


def test_semantic_policy_is_conservative() -> None:
    cfg, greedy = CacheConfig(semantic=True), SamplingParams(temperature=0.0)
    user = [{"role": "user", "content": "hi"}]
    assert semantic_allowed(cfg, {}, user, greedy)
    assert not semantic_allowed(cfg, {}, user, SamplingParams(temperature=0.7))
    assert not semantic_allowed(cfg, {"tools": [{"type": "function"}]}, user, greedy)
    assert not semantic_allowed(cfg, {"response_format": {"type": "json_object"}}, user, greedy)
    tool_result = {"messages": [{"role": "tool", "tool_call_id": "c1", "content": "42"}]}
    assert not semantic_allowed(cfg, tool_result, user, greedy)
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, *user]
    assert not semantic_allowed(cfg, {}, turns, greedy)
    assert semantic_allowed(CacheConfig(semantic=True, semantic_multi_turn=True), {}, turns, greedy)


def test_only_plain_text_answers_are_stored() -> None:
    message = {"role": "assistant", "content": "hi", "refusal": None}
    body = {"object": "chat.completion", "choices": [{"index": 0, "message": message}]}
    assert replayable(body) and replayable({**body, "choices": [{"index": 0, "message": {**message, "tool_calls": None}}]})
    calls = [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert not replayable({**body, "choices": [{"index": 0, "message": {**message, "tool_calls": calls}}]})


def test_answer_agreement_scoring(tmp_path: Path) -> None:
    """bench.cache_pairs.agreement's arithmetic, with the real embedder and an answerer that gives both questions of a
    paraphrase pair one answer and the two questions of a look-alike pair unrelated ones: a perfect separation."""
    from backend.embed.embeddings import Embedder
    from bench.cache_pairs import agreement

    rows = [("paraphrase", "how do i boil an egg", "how do you boil eggs"),
            ("paraphrase", "what is the capital of peru", "what's the capital of peru"),
            ("negative", "how do i boil an egg", "how do i poach an egg"),
            ("negative", "what is the capital of peru", "what is the capital of chile")]  # fmt: skip
    path = tmp_path / "pairs.tsv"
    path.write_text("".join(f"{label}\tk\td\t{a}\t{b}\n" for label, a, b in rows))
    answers = {"how do i boil an egg": "Put the egg in boiling water for nine minutes.",
               "how do you boil eggs": "Put the egg in boiling water for nine minutes.",
               "what is the capital of peru": "Lima is the capital of Peru.",
               "what's the capital of peru": "Lima is the capital of Peru.",
               "how do i poach an egg": "Stir a whirlpool into simmering vinegared water.",
               "what is the capital of chile": "Santiago, on the Mapocho river."}  # fmt: skip
    embedder = Embedder()

    async def embed(texts: list[str]) -> list[list[float]]:
        return embedder.embed_sync(texts)[0]

    async def answer(questions: list[str]) -> list[str]:
        return [answers[q] for q in questions]

    out = asyncio.run(agreement(path, answer, embed, 0.5))
    assert (out["paraphrase_pairs"], out["look_alike_pairs"], out["auc"]) == (2, 2, 1.0)
    at = {row["agreement"]: row for row in out["sweep"]}
    assert at[0.95]["paraphrases_agreeing"] == 1.0 and at[0.8]["look_alikes_disagreeing"] == 1.0
