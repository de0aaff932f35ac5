"""gateway/ratelimit.py: rpm/tpm windows in process and shared through a real redis-server."""

from __future__ import annotations

import pytest
from cache_fixtures import RedisServer, free_port, redis_server  # noqa: F401  (fixture)

from gateway.ratelimit import Limit, MemoryCounters, OverLimit, RateLimiter, RedisCounters


def clock() -> float:
    return 1_000_040.0  # 20 s into a minute


def _limiter(counters: object, errors: list[BaseException] | None = None) -> RateLimiter:
    sink = errors if errors is not None else []
    return RateLimiter(counters, "t", sink.append, clock=clock)  # type: ignore[arg-type]


async def test_requests_per_minute_in_process() -> None:
    limiter = _limiter(MemoryCounters(clock))
    limit = Limit("key:a", rpm=2, tpm=0)
    await limiter.admit(limit)
    await limiter.admit(limit)
    with pytest.raises(OverLimit) as info:
        await limiter.admit(limit)
    assert info.value.what == "requests" and info.value.retry_after_s == 40  # to the end of the minute
    await limiter.admit(Limit("key:b", rpm=2, tpm=0))  # another key has its own window


async def test_tokens_per_minute_refuse_once_spent() -> None:
    limiter = _limiter(MemoryCounters(clock))
    limit = Limit("deployment:x", rpm=0, tpm=100)
    await limiter.admit(limit)
    await limiter.spend(limit, 99)
    await limiter.admit(limit)
    await limiter.spend(limit, 5)
    with pytest.raises(OverLimit) as info:
        await limiter.admit(limit)
    assert info.value.what == "tokens"


async def test_two_gateways_share_limits_through_redis(redis_server: RedisServer) -> None:  # noqa: F811
    prefix = f"rl{free_port()}"
    one = RateLimiter(RedisCounters(redis_server.url), prefix, lambda e: None)
    two = RateLimiter(RedisCounters(redis_server.url), prefix, lambda e: None)
    limit = Limit("key:shared", rpm=3, tpm=0)
    for limiter in (one, two, one):
        await limiter.admit(limit)
    with pytest.raises(OverLimit):
        await two.admit(limit)
    await one.close()
    await two.close()


async def test_redis_down_fails_open() -> None:
    errors: list[BaseException] = []
    limiter = _limiter(RedisCounters(f"redis://127.0.0.1:{free_port()}/0"), errors)
    await limiter.admit(Limit("key:a", rpm=1, tpm=10))
    await limiter.admit(Limit("key:a", rpm=1, tpm=10))
    assert errors  # reported, not raised
    await limiter.close()
