"""Stored responses: what GET /v1/responses/{id}, input_items and previous_response_id read.

One record per response: the Response object, this request's input items, and the conversation
before it (earlier inputs and outputs, for continuing with previous_response_id). Records are keyed
by the tenant (a hash of the API key, as the response cache does) and the id, so a response made
with one key does not exist for another. In process (an LRU with a TTL) by default; in Redis when
the gateway has one configured (cache.backend redis, else router.redis_url), shared by replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import orjson

from gateway.cache.keys import namespace
from gateway.cache.stores import MemoryStore
from gateway.config import GatewayConfig
from gateway.errors import ServiceUnavailable
from gateway.ops.access_log import Logger

DEFAULT_TTL_S = 30 * 24 * 3600  # OpenAI keeps responses 30 days
DEFAULT_MAX_ENTRIES = 10000


class ResponseStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: int) -> None: ...

    async def delete(self, key: str) -> bool: ...

    async def close(self) -> None: ...


class MemoryResponseStore(MemoryStore):
    """In process: the response cache's LRU with per-entry TTLs (gateway/cache/stores.py), holding records only."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(max_entries, clock)


class RedisResponseStore:
    def __init__(self, url: str, timeout_s: float) -> None:
        from redis.asyncio import Redis  # only deployments that use Redis import it

        self.redis = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def get(self, key: str) -> bytes | None:
        value = cast(bytes | None, await self.redis.get(key))  # the client never decodes: replies are bytes
        return bytes(value) if value is not None else None

    async def put(self, key: str, value: bytes, ttl_s: int) -> None:
        await self.redis.set(key, value, ex=ttl_s)

    async def delete(self, key: str) -> bool:
        return bool(await self.redis.delete(key))

    async def close(self) -> None:
        await self.redis.aclose()


class StoredResponses:
    """The store, namespaced per API key; a backend failure is a 503 on reads, a logged warning on writes."""

    def __init__(self, store: ResponseStore, prefix: str, ttl_s: int, logger: Logger) -> None:
        self.store, self.prefix, self.ttl_s, self.logger = store, prefix, ttl_s, logger

    def _key(self, authorization: str | None, response_id: str) -> str:
        return f"{self.prefix}:responses:{namespace(authorization)}:{response_id}"

    async def get(self, authorization: str | None, response_id: str) -> dict[str, Any] | None:
        try:
            raw = await self.store.get(self._key(authorization, response_id))
        except Exception as exc:
            raise ServiceUnavailable("The response store is unavailable. Retry later.") from exc
        return orjson.loads(raw) if raw is not None else None

    async def put(self, authorization: str | None, response_id: str, record: dict[str, Any]) -> None:
        try:
            await self.store.put(self._key(authorization, response_id), orjson.dumps(record), self.ttl_s)
        except Exception as exc:
            self.logger.warning("response_store_unavailable", op="put", response_id=response_id, error=type(exc).__name__)

    async def delete(self, authorization: str | None, response_id: str) -> bool:
        try:
            return await self.store.delete(self._key(authorization, response_id))
        except Exception as exc:
            raise ServiceUnavailable("The response store is unavailable. Retry later.") from exc

    async def close(self) -> None:
        await self.store.close()


def build_store(config: GatewayConfig, logger: Logger) -> StoredResponses:
    """Redis when the gateway has one (the response cache's, else the router's), else in process."""
    cache = config.cache
    prefix = cache.key_prefix
    if cache.backend == "redis":
        store: ResponseStore = RedisResponseStore(cache.redis_url, max(cache.redis_timeout_s, 1.0))
    elif config.routing.router.redis_url:
        store = RedisResponseStore(config.routing.router.redis_url, 1.0)
    else:
        store = MemoryResponseStore()
    return StoredResponses(store, prefix, DEFAULT_TTL_S, logger)
