"""gateway/routing/http_pool.py: a deployment's connections split over small httpx pools, the least busy first."""

from __future__ import annotations

import httpx

from gateway.routing.http_pool import SHARD_CONNECTIONS, ShardedClient


async def test_shards_split_the_connections_and_lease_the_least_busy() -> None:
    pool = ShardedClient("http://127.0.0.1:1/v1", {}, 64, httpx.Timeout(1.0))
    assert len(pool.clients) == 64 // SHARD_CONNECTIONS
    leased = [pool.lease() for _ in range(8)]
    assert sorted(leased) == sorted(list(range(4)) * 2)  # spread evenly
    pool.release(leased[0])
    assert pool.lease() == leased[0]
    await pool.aclose()
    small = ShardedClient("http://127.0.0.1:1/v1", {}, 5, httpx.Timeout(1.0))
    assert len(small.clients) == 1
    await small.aclose()
