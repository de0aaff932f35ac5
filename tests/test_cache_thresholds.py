"""Per-entry thresholds (gateway/cache/thresholds.py): the error bound and the skip decision learned from outcomes."""

from __future__ import annotations

import math

import pytest

from gateway.cache.config import CacheConfig
from gateway.cache.thresholds import EntryThresholds, binomial_upper


def test_the_upper_limit_is_clopper_pearson() -> None:
    # with no error in n trials the one-sided limit is 1 - alpha^(1/n): the "rule of three" ~ 3/n at 95%
    for n in (1, 10, 59, 300):
        assert binomial_upper(0, n, 0.95) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-6)
    # one error in 20 trials at 95%: the textbook value 0.2161
    assert binomial_upper(1, 20, 0.95) == pytest.approx(0.2161, abs=1e-4)
    assert binomial_upper(0, 0, 0.95) == 1.0 and binomial_upper(3, 3, 0.95) == 1.0
    # the limit shrinks with evidence and grows with errors
    assert binomial_upper(0, 100, 0.95) < binomial_upper(0, 50, 0.95) < binomial_upper(1, 50, 0.95)


def test_an_entry_skips_verification_only_with_enough_right_outcomes_below_the_similarity() -> None:
    learned = EntryThresholds(delta=0.05)
    needed = math.ceil(math.log(0.05) / math.log(1 - 0.05))  # 59 right outcomes bound the error by 5%
    for _ in range(needed - 1):
        learned.observe("k", 0.80, True)
    assert not learned.decide("k", 0.85).skip
    learned.observe("k", 0.80, True)
    decision = learned.decide("k", 0.85)
    assert decision.skip and decision.evidence == needed and decision.bound <= 0.05
    # outcomes at a higher similarity say nothing about a lower one
    assert not learned.decide("k", 0.79).skip
    assert not learned.decide("other", 0.99).skip  # every entry learns its own


def test_a_wrong_outcome_below_the_similarity_stops_the_skipping() -> None:
    learned = EntryThresholds(delta=0.05)
    for _ in range(80):
        learned.observe("k", 0.9, True)
    assert learned.decide("k", 0.95).skip
    learned.observe("k", 0.88, False)  # a look-alike of this entry at a similarity below the candidate's
    assert not learned.decide("k", 0.95).skip
    assert learned.decide("k", 0.87).evidence == 0


def test_a_zero_bound_never_skips_and_the_record_is_bounded() -> None:
    never = EntryThresholds(delta=0.0)
    for _ in range(1000):
        never.observe("k", 0.5, True)
    assert not never.decide("k", 0.9).skip
    small = EntryThresholds(delta=0.05, per_entry=10, entries=2)
    for key in ("a", "b", "c"):
        small.observe(key, 0.9, True)
    assert len(small) == 2 and small.decide("a", 0.95).evidence == 0  # the least recent entry left
    for _ in range(50):
        small.observe("b", 0.9, True)
    assert small.decide("b", 0.95).evidence == 10


def test_the_error_bound_is_validated() -> None:
    with pytest.raises(ValueError, match="error_bound"):
        CacheConfig(error_bound=1.0)
    with pytest.raises(ValueError, match="error_bound"):
        CacheConfig(error_bound=-0.1)
    assert CacheConfig().error_bound == 0.0


def test_the_sampled_check_blocks_an_entry_at_and_below_a_disagreement() -> None:
    from gateway.cache.sampled import SampledCheck

    draws = iter([0.05, 0.5, 0.05])
    check = SampledCheck(rate=0.1, agreement=0.8, entries=10, draw=lambda: next(draws))
    assert check.admit("k", 0.9) == "sample" and check.admit("k", 0.9) == "serve"
    assert check.observe("k", 0.85, cosine=0.5) is False  # the answers disagreed at 0.85
    assert check.admit("k", 0.85) == "blocked" and check.admit("k", 0.80) == "blocked"
    assert check.admit("other", 0.80) == "sample"  # another entry is untouched
    assert check.observe("k", 0.95, cosine=0.9) is True
    assert check.record.contradicted("k", 0.85) and not check.record.contradicted("k", 0.86)
