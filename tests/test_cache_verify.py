"""The semantic cache's general mechanism: the lexical check, the verifier's criterion, and, through the live
servers (real engine, real embedder, no mocks), the engine verifier accepting a paraphrase and rejecting a
look-alike, and semantic matching staying off by default."""

from __future__ import annotations

import uuid
from typing import Any

import cache_fixtures
import gateway_fixtures
import pytest
from cache_fixtures import CacheStack
from gateway_fixtures import LiveStack

from gateway.cache import lexical
from gateway.cache.thresholds import EntryThresholds
from gateway.cache.verify import Answer, Criterion, Scores

cache_stack = cache_fixtures.cache_stack
live = gateway_fixtures.live


# ---- the criterion --------------------------------------------------------------------------------------------------


def test_criterion_accepts_an_answer_that_keeps_its_probability() -> None:
    crit = Criterion(max_drop=2.0, mean_drop=0.15)
    original = [-0.1, -0.5, -2.0, -0.01]
    assert crit.accept(original, original)
    assert crit.accept(original, [-0.2, -0.4, -2.3, -0.01])  # drops 0.1, -0.1, 0.3, 0: mean 0.075
    assert crit.accept(original, [-5.0, -5.0, -5.0, -5.0]) is False  # every token fell
    assert crit.accept(original, [x + 1.0 for x in original])  # more likely under the new prompt: fine


def test_criterion_rejects_one_token_that_falls_sharply() -> None:
    """One answer token that echoes what changed ("France" asked as "Germany") is enough to reject."""
    crit = Criterion(max_drop=2.0, mean_drop=0.15)
    original = [-0.05] * 40
    fallen = [*original[:20], -6.0, *original[21:]]  # the mean drop is only 0.15: the max catches it
    assert crit.accept(original, fallen) is False
    assert crit.accept(original, [*original[:20], -1.5, *original[21:]])


def test_reordered_candidates_face_the_strict_setting() -> None:
    """Same content words in another order may be a role reversal: only a nearly unchanged answer passes."""
    crit = Criterion(max_drop=5.0, mean_drop=0.2, reordered_max_drop=0.9, reordered_mean_drop=0.1)
    original = [-0.05] * 10
    shifted = [*original[:5], -2.0, *original[6:]]  # one token 1.95 nats less likely
    assert crit.accept(original, shifted) and not crit.accept(original, shifted, reordered=True)
    assert crit.accept(original, [x - 0.05 for x in original], reordered=True)


def test_criterion_scores_the_first_tokens_and_counts_greedy_choices() -> None:
    """The verifier prefills only the first `max_tokens` answer tokens; each one also says whether it is still the
    new prompt's greedy choice."""
    crit = Criterion(max_drop=2.0, mean_drop=0.15, min_greedy=0.75, max_tokens=4)
    original = [-0.1] * 8  # a longer answer: its tail is never scored
    assert crit.accept(original, Scores((-0.1,) * 4, (True,) * 4))
    assert crit.accept(original, Scores((-0.1,) * 4, (True, True, True, False)))  # 3 of 4 greedy
    assert not crit.accept(original, Scores((-0.1,) * 4, (True, False, False, True)))  # 2 of 4
    assert not crit.accept(original, Scores((-0.1, -0.1, -4.0, -0.1), (True,) * 4))  # one token fell 3.9 nats
    assert not crit.accept(original, Scores((-0.1,) * 3, (True,) * 3))  # fewer tokens scored than asked


def test_criterion_rejects_what_it_cannot_compare() -> None:
    crit = Criterion()
    assert crit.accept([], []) is False
    assert crit.accept([-0.1, -0.2], [-0.1]) is False


def test_answers_round_trip_through_json_and_reject_malformed_entries() -> None:
    answer = Answer((1, 2, 3), (-0.1, -0.25, -3.0))
    assert Answer.from_json(answer.to_json()) == answer
    for raw in (None, {}, {"ids": [1], "lps": []}, {"ids": [], "lps": []}, {"ids": "x", "lps": [0.0]}):
        assert Answer.from_json(raw) is None


# ---- the lexical check ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("What is the capital of France?", "what's the capital of france"),
        ("How many legs does a spider have?", "how many legs do spiders have"),
        ("How do I reverse a list in Python?", "Can you please tell me how to reverse a list in python?"),
        ("how r u supposed to boil an egg", "How are you supposed to boil eggs?"),
        ("why is the sky blue", "Quick question: why is the sky blue? Thanks in advance!"),
    ],
)
def test_lexical_check_passes_rephrasings(a: str, b: str) -> None:
    assert lexical.compare(b, a) == lexical.SAME


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("is it safe to eat raw cookie dough", "is it unsafe to eat raw cookie dough"),  # negating prefix
        ("best way to warm up soup", "best way to cool down soup"),  # antonyms inside collocations
        ("can dogs eat grapes", "can dogs not eat grapes"),  # negation
        ("do all birds fly", "do some birds fly"),  # quantifier
        ("recipe for vegetarian lasagna", "recipe for lasagna"),  # dropped modifier
    ],
)
def test_lexical_check_rejects_a_changed_content_word(a: str, b: str) -> None:
    assert lexical.compare(b, a) == lexical.DIFFERENT


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("why is my cat sneezing", "why is my dog sneezing"),  # siblings WordNet does not see
        ("summarize this article", "translate this article"),  # another task
    ],
)
def test_lexical_check_leaves_one_unrelated_word_to_the_verifier(a: str, b: str) -> None:
    assert lexical.compare(b, a) == lexical.SUBSTITUTED


def test_lexical_check_leaves_swapped_roles_to_the_verifier() -> None:
    assert lexical.compare("convert miles to kilometers", "convert kilometers to miles") == lexical.SWAPPED
    assert lexical.compare("in python, how do i sort a list", "how do i sort a list in python") == lexical.REORDERED


# ---- through the live servers --------------------------------------------------------------------------------------


def _ask(system: str, question: str, max_tokens: int = 24) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "gpt-4o-mini", "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def _post(stack: CacheStack, body: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    raw = stack.client().chat.completions.with_raw_response.create(**body)
    return raw.http_response.json(), raw.headers


def _verifications(stack: CacheStack, outcome: str) -> float:
    return stack.metric("memory", f'smolgate_cache_verifications_total{{outcome="{outcome}"}}')


def test_the_verifier_decides_what_the_words_cannot(cache_stack: CacheStack) -> None:
    """By default (`semantic_verify: auto`) a paraphrase whose words keep their roles is served on the lexical
    check alone; a role reversal (SWAPPED) and a sibling WordNet does not know (SUBSTITUTED) pass the embedding
    threshold, the guards and the word check, and only the engine, scoring the cached answer under the new
    question, turns them away."""
    system = f"You are a helpful assistant. Session {uuid.uuid4().hex[:8]}."
    original, _ = _post(cache_stack, _ask(system, "How do I convert miles to kilometers?"))
    accepted, rejected = _verifications(cache_stack, "accepted"), _verifications(cache_stack, "rejected")
    body, headers = _post(cache_stack, _ask(system, "how do i convert miles to kilometers"))
    assert headers["x-cache"] == "semantic-hit" and body["choices"] == original["choices"]
    assert _verifications(cache_stack, "accepted") == accepted  # no engine pass
    _, headers = _post(cache_stack, _ask(system, "How do I convert kilometers to miles?"))  # the roles reversed
    assert headers["x-cache"] == "miss"
    assert _verifications(cache_stack, "rejected") == rejected + 1
    _post(cache_stack, _ask(system, "Why is my cat sneezing?"))
    _, headers = _post(cache_stack, _ask(system, "why is my dog sneezing"))  # one word nothing relates
    assert headers["x-cache"] == "miss"
    assert _verifications(cache_stack, "rejected") == rejected + 2
    assert cache_stack.metric("memory", 'smolgate_cache_near_misses_total{reason="verifier"}') >= 2


def test_with_verify_all_the_engine_confirms_every_candidate(cache_stack: CacheStack) -> None:
    system = f"You are a helpful assistant. Session {uuid.uuid4().hex[:8]}."
    with cache_stack.configured(semantic_verify="all"):
        original, _ = _post(cache_stack, _ask(system, "Can stress cause hair loss?"))
        accepted = _verifications(cache_stack, "accepted")
        body, headers = _post(cache_stack, _ask(system, "can stress cause hair loss"))
        assert headers["x-cache"] == "semantic-hit" and body["choices"] == original["choices"]
        assert _verifications(cache_stack, "accepted") == accepted + 1


def test_an_entry_with_enough_verified_outcomes_skips_the_engine(cache_stack: CacheStack) -> None:
    """Per-entry thresholds (cache.error_bound): once an entry's own verified outcomes bound the chance of a wrong
    answer at a candidate's similarity, the candidate is served without a prefill (`semantic_verify: all`: with
    `auto` a candidate whose words keep their roles never needs one). With a loose bound of 50%, five
    right outcomes at 95% confidence suffice (1 - 0.05^(1/5) = 0.45)."""
    cache = cache_stack.contexts["memory"].cache
    saved = cache.thresholds
    cache.thresholds = EntryThresholds(delta=0.5)
    try:
        with cache_stack.configured(semantic_verify="all"):
            system = f"You are a helpful assistant. Session {uuid.uuid4().hex[:8]}."
            original, _ = _post(cache_stack, _ask(system, "How do I descale a kettle?"))
            accepted, skipped = _verifications(cache_stack, "accepted"), _verifications(cache_stack, "skipped")
            for i in range(6):
                body, headers = _post(cache_stack, _ask(system, "how do i descale a kettle"))
                assert headers["x-cache"] == "semantic-hit" and body["choices"] == original["choices"]
                assert _verifications(cache_stack, "accepted") == accepted + min(i + 1, 5)
                assert _verifications(cache_stack, "skipped") == skipped + max(i - 4, 0)
    finally:
        cache.thresholds = saved


def test_entries_carry_the_answer_for_the_verifier_and_responses_do_not_show_it(cache_stack: CacheStack) -> None:
    import orjson

    system = f"You are terse. Session {uuid.uuid4().hex[:8]}."
    body, _ = _post(cache_stack, _ask(system, "Why is the sky blue?", max_tokens=8))
    assert body["choices"][0]["logprobs"] is None  # recorded for the cache, not shown: the client did not ask
    stored = [orjson.loads(v) for v, _ in cache_stack.memory_store._entries.values()]
    entry = next(e for e in stored if e.get("query") == "Why is the sky blue?" and e["body"]["id"] == body["id"])
    answer = Answer.from_json(entry["answer"])
    assert answer is not None and len(answer.token_ids) == body["usage"]["completion_tokens"]
    assert all(lp <= 0.0 for lp in answer.logprobs)


def test_semantic_matching_is_off_by_default(live: LiveStack) -> None:
    """The default configuration caches exact repeats only: a paraphrase is generated, not served from the cache."""
    question = f"What is the capital of France? (ticket {uuid.uuid4().int % 10**6})"
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}], "max_tokens": 6, "temperature": 0}
    client = live.client()
    first = client.chat.completions.with_raw_response.create(**body)
    again = client.chat.completions.with_raw_response.create(**body)
    paraphrase = {**body, "messages": [{"role": "user", "content": question.replace("What is", "What's")}]}
    other = client.chat.completions.with_raw_response.create(**paraphrase)
    assert (first.headers["x-cache"], again.headers["x-cache"], other.headers["x-cache"]) == ("miss", "hit", "miss")
