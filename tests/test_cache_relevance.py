"""Answer-conditioned relevance (gateway/cache/relevance.py): the criterion on two cosines, the entry format, and,
with the real embedder on answers the real engine wrote for questions of tests/data/cache_pairs/dev.tsv, a
paraphrase served and look-alikes refused."""

from __future__ import annotations

import math

import cache_fixtures
import orjson
from cache_fixtures import CacheStack

from gateway.cache.config import CacheConfig
from gateway.cache.relevance import ANSWER_WORDS, AnswerVector, cosine, excerpt, passes, relevant

cache_stack = cache_fixtures.cache_stack


def _unit(*xs: float) -> tuple[float, ...]:
    norm = math.sqrt(sum(x * x for x in xs))
    return tuple(x / norm for x in xs)


def test_the_criterion_compares_the_answer_with_both_questions() -> None:
    assert passes(0.60, 0.60, 0.0) and passes(0.70, 0.60, 0.0)  # as close as to its own question, or closer
    assert passes(0.59, 0.60, 0.02) and not passes(0.57, 0.60, 0.02)
    answer = AnswerVector.of(_unit(1.0, 1.0, 0.0), _unit(1.0, 0.0, 0.0))  # its own question: cos 0.707
    assert math.isclose(answer.question_cos, math.sqrt(0.5))
    assert relevant(_unit(1.0, 0.9, 0.0), answer, 0.0)  # nearer the answer than the original was
    assert not relevant(_unit(1.0, 0.0, 1.0), answer, 0.02)  # cos 0.5: the answer is about something else
    assert not relevant(_unit(1.0, 0.0), answer, 1.0)  # another embedder's dimensions: never served


def test_answer_vectors_round_trip_and_reject_malformed_entries() -> None:
    answer = AnswerVector.of(_unit(0.3, -0.2, 0.9), _unit(0.1, 0.0, 1.0))
    back = AnswerVector.from_json(answer.to_json())
    assert back is not None and math.isclose(back.question_cos, answer.question_cos, abs_tol=1e-5)
    assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in zip(back.vector, answer.vector, strict=True))
    for raw in (None, {}, {"v": [], "qc": 0.5}, {"v": [0.1], "qc": "x"}, {"v": "x", "qc": 0.5}):
        assert AnswerVector.from_json(raw) is None


def test_the_excerpt_is_the_answers_opening() -> None:
    words = [f"w{i}" for i in range(ANSWER_WORDS + 20)]
    assert excerpt(" ".join(words)) == " ".join(words[:ANSWER_WORDS])
    assert excerpt("  two\nwords ") == "two words"
    assert math.isclose(cosine(_unit(1.0, 2.0), _unit(1.0, 2.0)), 1.0)


def test_relevance_is_off_by_default_and_its_margin_validated() -> None:
    """Off: on the dev and holdout pairs, with the lexical check as it is, it refused right hits and no wrong one."""
    cfg = CacheConfig()
    assert not cfg.relevance and 0.0 <= cfg.relevance_margin < 0.2
    try:
        CacheConfig(relevance_margin=-0.1)
    except ValueError:
        pass
    else:
        raise AssertionError("a negative margin must be refused")


# ---- through the live server: the real engine writes the answers, the cache's real embedder embeds them ------------


def _ask(stack: CacheStack, question: str) -> tuple[dict[str, object], str]:
    """One deterministic chat request with no system prompt, as bench.cache_pairs calibrates (64-token answers)."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}], "max_tokens": 64,
            "temperature": 0}  # fmt: skip
    client = stack.client().with_options(timeout=600)  # 64 tokens: a loaded machine can take minutes
    raw = client.chat.completions.with_raw_response.create(**body)
    return raw.http_response.json(), raw.headers["x-cache"]


def _entry(stack: CacheStack, question: str) -> dict[str, object]:
    assert stack.memory_store is not None
    stored = [orjson.loads(v) for v, _ in stack.memory_store._entries.values()]
    return next(e for e in stored if e.get("query") == question)


def test_a_paraphrase_is_served_and_an_attribute_look_alike_is_not_relevant(cache_stack: CacheStack) -> None:
    """Two pairs of the dev split. "my phone is not charging" asks what "my phone isn't charging" asked: the cached
    answer relates to it as well as to its own question, and it is served. "how much potassium is in a banana"
    embeds close to a cached "how much sugar is in a banana" (cosine ~0.75), but the cached answer talks about
    sugar: it relates far less to the look-alike than to its own question (on dev, by 0.25 in cosine)."""
    with cache_stack.configured(relevance=True):
        _paraphrase_served_look_alike_not_relevant(cache_stack)


def _paraphrase_served_look_alike_not_relevant(cache_stack: CacheStack) -> None:
    margin = cache_stack.contexts["memory"].cache.cfg.relevance_margin
    original, status = _ask(cache_stack, "my phone isn't charging")
    assert status == "miss"
    served, status = _ask(cache_stack, "my phone is not charging")
    assert status == "semantic-hit" and served["choices"] == original["choices"]

    _ask(cache_stack, "how much sugar is in a banana")
    _, status = _ask(cache_stack, "how much potassium is in a banana")
    assert status == "miss"  # the lexical check refuses it too (sugar / potassium are siblings)
    sugar = AnswerVector.from_json(_entry(cache_stack, "how much sugar is in a banana")["relevance"])
    assert sugar is not None and len(sugar.vector) == 384
    vectors = cache_stack.memory_store.vectors  # type: ignore[union-attr]
    assert not relevant(vectors["how much potassium is in a banana"], sugar, margin)
    phone = AnswerVector.from_json(_entry(cache_stack, "my phone isn't charging")["relevance"])
    # the stored cosine is the answer's with its own question (to the 4 decimals the vector is kept at)
    assert phone is not None and abs(cosine(vectors["my phone isn't charging"], phone.vector) - phone.question_cos) < 1e-3


def test_the_check_refuses_a_candidate_the_lexical_check_passed(cache_stack: CacheStack) -> None:
    """What the check costs, on a dev pair: "hey, do you happen to know who wrote pride and prejudice" is a paraphrase
    the lexical check passes (the framing words may differ), but the framing moves its embedding away from the cached
    answer (on dev by 0.095 in cosine), so it is refused as `relevance` and generated, not served."""
    before = cache_stack.metric("memory", 'smolgate_cache_near_misses_total{reason="relevance"}')
    with cache_stack.configured(relevance=True):
        _ask(cache_stack, "who wrote pride and prejudice")
        _, status = _ask(cache_stack, "hey, do you happen to know who wrote pride and prejudice")
    assert status == "miss"
    assert cache_stack.metric("memory", 'smolgate_cache_near_misses_total{reason="relevance"}') == before + 1
