"""Where entries live: the CacheStore protocol, the in-process LRU store, and SafeStore, which
turns a failing backend (Redis down) into misses, a warning and a counter — never an error."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from gateway.cache.index import Candidate, SemanticIndex, search_off_loop

T = TypeVar("T")


class CacheStore(Protocol):
    """Exact entries by key (with a TTL) and, per semantic scope, the vectors of cached questions."""

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: int) -> None: ...

    async def add_vector(self, scope: str, key: str, text: str, vector: list[float], *, ttl_s: int) -> None: ...

    async def search(self, scope: str, vector: list[float], k: int, floor: float) -> list[Candidate]: ...

    async def close(self) -> None: ...


class MemoryStore:
    """The embedded default: an LRU of at most `max_entries` entries, each with its own TTL."""

    def __init__(self, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        self._indexes: dict[str, SemanticIndex] = {}
        self._scope_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        item = self._entries.get(key)
        if item is None:
            return None
        if item[1] <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return item[0]

    async def put(self, key: str, value: bytes, ttl_s: int) -> None:
        self._entries[key] = (value, self._clock() + ttl_s)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._drop(next(iter(self._entries)))

    async def add_vector(self, scope: str, key: str, text: str, vector: list[float], *, ttl_s: int) -> None:
        index = self._indexes.get(scope)
        if index is None:
            index = self._indexes[scope] = SemanticIndex(len(vector), self.max_entries)
        index.add(key, text, vector)
        self._scope_of[key] = scope

    async def search(self, scope: str, vector: list[float], k: int, floor: float) -> list[Candidate]:
        index = self._indexes.get(scope)
        return await search_off_loop(index, vector, k, floor) if index is not None else []

    async def delete(self, key: str) -> bool:
        """Drop `key` (and its vector); whether it was there."""
        found = key in self._entries
        self._drop(key)
        return found

    async def close(self) -> None:
        self._entries.clear()
        self._indexes.clear()
        self._scope_of.clear()

    def _drop(self, key: str) -> None:
        self._entries.pop(key, None)
        scope = self._scope_of.pop(key, None)
        if scope is not None:
            index = self._indexes[scope]
            index.remove(key)
            if not len(index):
                del self._indexes[scope]


class SafeStore:
    """Wraps a store: a failing call is logged (at most every `warn_every_s`), counted, and answered
    with a default (a miss, nothing stored); after a failure the backend rests `retry_s`."""

    def __init__(
        self,
        inner: CacheStore,
        on_error: Callable[[str, BaseException | None], None],
        retry_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self._on_error = on_error
        self._retry_s = retry_s
        self._clock = clock
        self._down_until = 0.0

    async def _call(self, op: str, work: Callable[[], Awaitable[T]], default: T) -> T:
        if self._clock() < self._down_until:
            self._on_error(op, None)  # skipped: the backend failed moments ago
            return default
        try:
            return await work()
        except Exception as exc:  # any backend failure: connection refused, timeout, protocol error...
            self._down_until = self._clock() + self._retry_s
            self._on_error(op, exc)
            return default

    async def get(self, key: str) -> bytes | None:
        return await self._call("get", lambda: self.inner.get(key), None)

    async def put(self, key: str, value: bytes, ttl_s: int) -> None:
        await self._call("put", lambda: self.inner.put(key, value, ttl_s), None)

    async def add_vector(self, scope: str, key: str, text: str, vector: list[float], *, ttl_s: int) -> None:
        await self._call("add_vector", lambda: self.inner.add_vector(scope, key, text, vector, ttl_s=ttl_s), None)

    async def search(self, scope: str, vector: list[float], k: int, floor: float) -> list[Candidate]:
        empty: list[Candidate] = []
        return await self._call("search", lambda: self.inner.search(scope, vector, k, floor), empty)

    async def close(self) -> None:
        await self._call("close", self.inner.close, None)


def describe(exc: BaseException | None) -> dict[str, Any]:
    if exc is None:
        return {"reason": "backend resting after an error"}
    return {"reason": type(exc).__name__, "detail": str(exc)[:200]}
