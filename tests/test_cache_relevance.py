"""Answer-conditioned relevance (gateway/cache/relevance.py): the criterion on two cosines, the entry format, and,
with the real embedder on answers the real engine wrote for questions of tests/data/cache_pairs/dev.tsv, a
paraphrase served and look-alikes refused."""

from __future__ import annotations

import math

from gateway.cache.config import CacheConfig
from gateway.cache.relevance import ANSWER_WORDS, AnswerVector, cosine, excerpt, passes, relevant


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


def test_relevance_is_on_with_a_calibrated_margin_and_validated() -> None:
    cfg = CacheConfig()
    assert cfg.relevance and 0.0 <= cfg.relevance_margin < 0.2
    try:
        CacheConfig(relevance_margin=-0.1)
    except ValueError:
        pass
    else:
        raise AssertionError("a negative margin must be refused")
