"""Requests- and tokens-per-minute limits, per API key and per deployment, in fixed one-minute windows.

In process by default; with `router.redis_url` the counters live in Redis so every gateway replica
sees the same totals. Requests are counted when admitted, tokens when the response is done (a request
is refused once the window's tokens already reach the limit). A Redis outage lets traffic through
(fail open) rather than failing every request: the limits protect upstreams, they are not billing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

WINDOW_S = 60


@dataclass(frozen=True)
class Limit:
    scope: str  # "key:<name>" or "deployment:<name>"
    rpm: int
    tpm: int

    @property
    def active(self) -> bool:
        return bool(self.rpm or self.tpm)


class Counters(Protocol):
    async def incr(self, key: str, amount: int) -> int: ...

    async def get(self, key: str) -> int: ...

    async def close(self) -> None: ...


class MemoryCounters:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._values: dict[str, int] = {}
        self._window = -1
        self._clock = clock

    def _roll(self) -> None:
        window = int(self._clock()) // WINDOW_S
        if window != self._window:  # keys carry their window, so older ones are dead: drop them
            self._values = {k: v for k, v in self._values.items() if k.endswith(f":{window}")}
            self._window = window

    async def incr(self, key: str, amount: int) -> int:
        self._roll()
        self._values[key] = self._values.get(key, 0) + amount
        return self._values[key]

    async def get(self, key: str) -> int:
        self._roll()
        return self._values.get(key, 0)

    async def close(self) -> None:
        return None


class RedisCounters:
    def __init__(self, url: str, timeout_s: float = 0.25) -> None:
        import redis.asyncio as redis  # only gateways configured with Redis import it

        self._redis = redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def incr(self, key: str, amount: int) -> int:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incrby(key, amount)
            pipe.expire(key, WINDOW_S * 2)
            value, _ = await pipe.execute()
        return int(value)

    async def get(self, key: str) -> int:
        value = await self._redis.get(key)
        return int(value) if value is not None else 0

    async def close(self) -> None:
        await self._redis.aclose()


class OverLimit(Exception):
    def __init__(self, scope: str, what: str, retry_after_s: int) -> None:
        super().__init__(f"{scope}: {what} per minute exceeded")
        self.scope = scope
        self.what = what
        self.retry_after_s = retry_after_s


class RateLimiter:
    def __init__(
        self, counters: Counters, prefix: str, on_error: Callable[[BaseException], None], clock: Callable[[], float] = time.time
    ):
        self.counters = counters
        self.prefix = prefix
        self.on_error = on_error
        self.clock = clock

    def _key(self, limit: Limit, what: str) -> tuple[str, int]:
        now = self.clock()
        window = int(now) // WINDOW_S
        retry = max(1, math.ceil((window + 1) * WINDOW_S - now))
        return f"{self.prefix}:{limit.scope}:{what}:{window}", retry

    async def admit(self, limit: Limit) -> None:
        """Count one request against `limit`; OverLimit (with seconds to the next window) when over."""
        if not limit.active:
            return
        try:
            if limit.tpm:
                key, retry = self._key(limit, "tpm")
                if await self.counters.get(key) >= limit.tpm:
                    raise OverLimit(limit.scope, "tokens", retry)
            if limit.rpm:
                key, retry = self._key(limit, "rpm")
                if await self.counters.incr(key, 1) > limit.rpm:
                    raise OverLimit(limit.scope, "requests", retry)
        except OverLimit:
            raise
        except Exception as exc:  # Redis down or slow: fail open
            self.on_error(exc)

    async def spend(self, limit: Limit, tokens: int) -> None:
        if not limit.tpm or tokens <= 0:
            return
        try:
            await self.counters.incr(self._key(limit, "tpm")[0], tokens)
        except Exception as exc:
            self.on_error(exc)

    async def tokens_left(self, limit: Limit) -> int | None:
        """What is left of `limit`'s tpm in this window (may be negative); None without a tpm or when the
        counters cannot be read (fail open, as `admit` does)."""
        if not limit.tpm:
            return None
        try:
            return limit.tpm - await self.counters.get(self._key(limit, "tpm")[0])
        except Exception as exc:
            self.on_error(exc)
            return None

    async def close(self) -> None:
        await self.counters.close()


def build_limiter(redis_url: str, prefix: str, on_error: Callable[[BaseException], None]) -> RateLimiter:
    counters: Any = RedisCounters(redis_url) if redis_url else MemoryCounters()
    return RateLimiter(counters, prefix, on_error)
