"""An upstream's connection pool split over several httpx clients of at most SHARD_CONNECTIONS each.

httpcore scans every connection of a pool (and asks each whether it expired) whenever a request is
queued or a connection is released, so one pool's cost per request grows with its size: at 64 in flight a
pool of 64 serves fewer requests/s than pools of 8 or 16 (bench/README.md, `## routing`). Shards keep each
scan short while the deployment still gets its full `max_connections`; a request takes the least busy shard.
"""

from __future__ import annotations

import asyncio
import math

import httpx

SHARD_CONNECTIONS = 16


class ShardedClient:
    def __init__(self, base_url: str, headers: dict[str, str], max_connections: int, timeout: httpx.Timeout) -> None:
        shards = max(1, math.ceil(max_connections / SHARD_CONNECTIONS))
        size = math.ceil(max_connections / shards)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        self.clients = [
            httpx.AsyncClient(base_url=base_url, headers=headers, limits=limits, timeout=timeout) for _ in range(shards)
        ]
        self.busy = [0] * shards

    def lease(self) -> int:
        """The index of the least busy shard, now counted busier by one; give it back with release()."""
        i = min(range(len(self.busy)), key=self.busy.__getitem__)
        self.busy[i] += 1
        return i

    def release(self, i: int) -> None:
        self.busy[i] -= 1

    async def aclose(self) -> None:
        await asyncio.gather(*(c.aclose() for c in self.clients), return_exceptions=True)
