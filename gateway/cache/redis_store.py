"""RedisStore: entries and semantic vectors shared by every gateway replica.

- Entries: `{prefix}:e:{key}` = the response bytes, with `SET ... EX ttl` (Redis expires them;
  configure `maxmemory-policy allkeys-lru` on the server for LRU eviction under memory pressure).
- Vectors: one Redis stream per semantic scope, `{prefix}:v:{scope}`, of {key, text, vec} records
  (vec = float32 bytes), capped at about `max_entries` records. Each replica mirrors the streams it
  queries into a local SemanticIndex and reads only the records added since its last read (one
  XRANGE per lookup), so a replica that joins sees everything others wrote, and searches at
  in-process speed. A vector whose entry expired is skipped at lookup (its GET misses).
- Outcomes (`RedisOutcomes`): one stream per kind of per-entry record (`{prefix}:o:{name}`: the engine verifier's,
  the sampled check's), of {key, sim, right} records, capped at about `max_records`; read the same way, from the
  last id each replica saw (gateway/cache/thresholds.py).
"""

from __future__ import annotations

from array import array
from typing import cast

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT, StreamRangeResponse

from gateway.cache.index import Candidate, SemanticIndex, search_off_loop

_BATCH = 5000

# The clients are made without decode_responses, so every reply is bytes; redis-py's annotations also allow str (and
# None), which these casts narrow (no runtime cost).
_Record = tuple[bytes, dict[bytes, bytes]]


def _records(reply: StreamRangeResponse | None) -> list[_Record]:
    return cast(list[_Record], reply)


class RedisStore:
    def __init__(self, url: str, prefix: str, max_entries: int, timeout_s: float) -> None:
        self.redis = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.prefix = prefix
        self.max_entries = max_entries
        self._mirrors: dict[str, tuple[SemanticIndex | None, str]] = {}  # scope -> (index, last stream id)

    def _entry(self, key: str) -> str:
        return f"{self.prefix}:e:{key}"

    def _stream(self, scope: str) -> str:
        return f"{self.prefix}:v:{scope}"

    async def get(self, key: str) -> bytes | None:
        value = cast(bytes | None, await self.redis.get(self._entry(key)))
        return bytes(value) if value is not None else None

    async def put(self, key: str, value: bytes, ttl_s: int) -> None:
        await self.redis.set(self._entry(key), value, ex=ttl_s)

    async def add_vector(self, scope: str, key: str, text: str, vector: list[float], *, ttl_s: int) -> None:
        record: dict[FieldT, EncodableT] = {"key": key, "text": text.encode(), "vec": array("f", vector).tobytes()}
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self._stream(scope), record, maxlen=self.max_entries, approximate=True)
            pipe.expire(self._stream(scope), ttl_s)
            await pipe.execute()

    async def search(self, scope: str, vector: list[float], k: int, floor: float) -> list[Candidate]:
        index = await self._sync(scope, len(vector))
        return await search_off_loop(index, vector, k, floor) if index is not None else []

    async def _sync(self, scope: str, dimensions: int) -> SemanticIndex | None:
        """Pull the records written (by any replica) since this replica last read the scope."""
        index, last = self._mirrors.get(scope, (None, "0-0"))
        while True:
            records = _records(await self.redis.xrange(self._stream(scope), min=f"({last}", count=_BATCH))
            for record_id, fields in records:
                if index is None:
                    index = SemanticIndex(dimensions, self.max_entries)
                vec = array("f")
                vec.frombytes(fields[b"vec"])
                index.add(fields[b"key"].decode(), fields[b"text"].decode(), vec)
                last = record_id.decode()
            self._mirrors[scope] = (index, last)
            if len(records) < _BATCH:
                return index

    def outcomes(self, name: str, max_records: int, ttl_s: int) -> RedisOutcomes:
        """A shared log of per-entry outcomes on this store's connection."""
        return RedisOutcomes(self.redis, self.prefix, name, max_records, ttl_s=ttl_s)

    async def close(self) -> None:
        await self.redis.aclose()


class RedisOutcomes:
    """The OutcomeLog of gateway/cache/thresholds.py in a Redis stream every replica appends to and reads from."""

    def __init__(self, redis: Redis, prefix: str, name: str, max_records: int, *, ttl_s: int) -> None:
        self.redis, self.stream, self.max_records, self.ttl_s = redis, f"{prefix}:o:{name}", max_records, ttl_s
        self._last = "0-0"

    async def append(self, key: str, similarity: float, right: bool) -> None:
        record: dict[FieldT, EncodableT] = {"key": key, "sim": repr(float(similarity)), "right": b"1" if right else b"0"}
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xadd(self.stream, record, maxlen=self.max_records, approximate=True)
            pipe.expire(self.stream, self.ttl_s)
            await pipe.execute()

    async def since_last(self) -> list[tuple[str, float, bool]]:
        out: list[tuple[str, float, bool]] = []
        while True:
            records = _records(await self.redis.xrange(self.stream, min=f"({self._last}", count=_BATCH))
            for record_id, fields in records:
                out.append((fields[b"key"].decode(), float(fields[b"sim"]), fields[b"right"] == b"1"))
                self._last = record_id.decode()
            if len(records) < _BATCH:
                return out
