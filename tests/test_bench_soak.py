"""A short soak (python -m bench.soak) against the live gateway: mixed traffic with aborted clients and bad
requests; no unexpected error, no 5xx, no KV block left held, and the RSS does not run away."""

from __future__ import annotations

from gateway_fixtures import API_KEY, LiveStack, live  # noqa: F401

from bench.soak import soak


async def test_a_short_soak_loses_nothing(live: LiveStack) -> None:  # noqa: F811
    result = await soak(live.url, API_KEY, duration_s=30, concurrency=3, seed=11)
    assert result["unexpected_errors"] == 0, result["unexpected_examples"]
    assert result["server_5xx"] == 0
    assert result["leaked_kv_blocks"] == 0 and result["in_flight_after"] == 0
    kinds = result["by_kind"]
    assert {"plain", "stream", "cached", "bad"} <= set(kinds), kinds  # the mix really ran
    assert result["cache_hits"] > 0
    growth = result["rss"]["growth_mb"]
    assert growth is None or growth < 200, result["rss"]  # generous: the test process shares the machine
