"""Per-entry thresholds (gateway/cache/thresholds.py): the error bound and the skip decision learned from outcomes."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest
from cache_fixtures import RedisServer, free_port, redis_server  # noqa: F401 - the session fixture

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
    check = SampledCheck(rate=0.1, agreement=0.8, record=EntryThresholds(0.0), draw=lambda: next(draws))

    async def run() -> None:
        assert await check.admit("k", 0.9) == "sample" and await check.admit("k", 0.9) == "serve"
        assert await check.observe("k", 0.85, cosine=0.5) is False  # the answers disagreed at 0.85
        assert await check.admit("k", 0.85) == "blocked" and await check.admit("k", 0.80) == "blocked"
        assert await check.admit("other", 0.80) == "sample"  # another entry is untouched
        assert await check.observe("k", 0.95, cosine=0.9) is True
        assert check.record.contradicted("k", 0.85) and not check.record.contradicted("k", 0.86)

    asyncio.run(run())


def test_replicas_share_what_they_learn_through_redis(redis_server: RedisServer) -> None:  # noqa: F811
    """Two replicas' records on one real redis-server: an outcome one of them records is in the other's decision
    after its next refresh, and a replica that starts later reads everything; its own outcomes come back once."""
    from redis.asyncio import Redis

    from gateway.cache.redis_store import RedisOutcomes

    async def run() -> None:
        clients = [Redis.from_url(redis_server.url) for _ in range(3)]
        prefix = f"t{uuid.uuid4().hex[:8]}"
        a, b = (EntryThresholds(0.5, log=RedisOutcomes(c, prefix, "engine", 1000, ttl_s=60)) for c in clients[:2])
        try:
            for _ in range(5):
                await a.record("entry", 0.9, True)
            await asyncio.gather(b.refresh(), b.refresh(), b.refresh())  # requests refreshing at once: read once
            assert b.decide("entry", 0.9).skip and b.decide("entry", 0.9).evidence == 5
            await a.refresh()
            assert a.decide("entry", 0.9).evidence == 5  # its own outcomes, read back once
            await b.record("entry", 0.85, False)
            late = EntryThresholds(0.5, log=RedisOutcomes(clients[2], prefix, "engine", 1000, ttl_s=60))
            await late.refresh()
            assert late.decide("entry", 0.9).evidence == 6 and not late.decide("entry", 0.9).skip
            other = EntryThresholds(0.5, log=RedisOutcomes(clients[2], prefix, "upstream", 1000, ttl_s=60))
            await other.refresh()
            assert other.decide("entry", 0.9).evidence == 0  # another kind of record: another log
        finally:
            for c in clients:
                await c.aclose()

    asyncio.run(run())


def test_a_shared_log_that_fails_keeps_the_outcome_locally() -> None:
    from redis.asyncio import Redis

    from gateway.cache.redis_store import RedisOutcomes

    errors: list[BaseException] = []

    async def run() -> None:
        down = Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.2, socket_timeout=0.2)
        record = EntryThresholds(0.5, log=RedisOutcomes(down, "t", "engine", 100, ttl_s=60), on_error=errors.append)
        try:
            await record.record("entry", 0.9, True)
            await record.refresh()  # nothing to read: no error raised, the local record decides
            assert record.decide("entry", 0.9).evidence == 1
        finally:
            await down.aclose()

    asyncio.run(run())
    assert len(errors) == 2


def test_a_gateway_caching_in_redis_shares_its_records(redis_server: RedisServer) -> None:  # noqa: F811
    from backend.embed.embeddings import Embedder
    from gateway.app import build_context
    from gateway.cache.redis_store import RedisOutcomes
    from gateway.config import from_mapping

    cache = {"backend": "redis", "redis_url": redis_server.url, "semantic": True, "upstream_sample": 0.1}
    ctx = build_context(from_mapping({"cache": cache}), None, Embedder())
    check = ctx.cache.upstream_check
    assert check is not None and isinstance(check.record.log, RedisOutcomes)
    memory = build_context(from_mapping({"cache": {**cache, "backend": "memory"}}), None, Embedder()).cache
    assert memory.upstream_check is not None and memory.upstream_check.record.log is None
