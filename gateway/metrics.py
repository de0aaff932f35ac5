"""Prometheus metrics: one registry per app (no process-global state), engine gauges at scrape time."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.outputs import EngineStats
from gateway.record import RequestRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineCollector(Collector):
    """Reads engine.stats() on every scrape: queue depth, KV usage, prefix-cache hits."""

    def __init__(self, stats: Callable[[], EngineStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        try:
            s = self._stats()
        except Exception:
            yield GaugeMetricFamily("smolgate_engine_up", "1 when the engine answers stats()", value=0)
            return
        yield GaugeMetricFamily("smolgate_engine_up", "1 when the engine answers stats()", value=1)
        yield GaugeMetricFamily(
            "smolgate_engine_waiting_requests", "Queue depth: requests waiting", value=s.num_waiting
        )
        yield GaugeMetricFamily("smolgate_engine_running_requests", "Requests running", value=s.num_running)
        yield GaugeMetricFamily(
            "smolgate_kv_cache_blocks_used", "KV cache blocks in use", value=s.kv_blocks_used
        )
        yield GaugeMetricFamily(
            "smolgate_kv_cache_blocks_total", "KV cache blocks in the pool", value=s.kv_blocks_total
        )
        usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
        yield GaugeMetricFamily("smolgate_kv_cache_usage_ratio", "Fraction of KV blocks in use", value=usage)
        yield from _engine_counters(s)
        for key, value in sorted(s.extra.items()):
            name = "smolgate_engine_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
            yield GaugeMetricFamily(name, f"Engine statistic {key}", value=value)


def _engine_counters(s: EngineStats) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "smolgate_prefix_cache_queries", "Prefix-cache block lookups", value=s.prefix_cache_queries
    )
    yield CounterMetricFamily(
        "smolgate_prefix_cache_hits", "Prefix-cache block hits", value=s.prefix_cache_hits
    )
    yield CounterMetricFamily(
        "smolgate_engine_prompt_tokens", "Prompt tokens the engine processed", value=s.prompt_tokens_total
    )
    yield CounterMetricFamily(
        "smolgate_engine_generation_tokens", "Tokens the engine generated", value=s.generation_tokens_total
    )
    yield CounterMetricFamily("smolgate_engine_preemptions", "Sequences preempted", value=s.num_preemptions)


class GatewayMetrics:
    """Per-request counters and histograms, plus the engine collector, in a private registry."""

    def __init__(self, engine_stats: Callable[[], EngineStats] | None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(
            "smolgate_requests", "HTTP requests", ["route", "model", "status"], registry=r
        )
        self.latency = Histogram(
            "smolgate_request_duration_seconds",
            "End-to-end request latency",
            ["route", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "smolgate_time_to_first_token_seconds",
            "Time to the first generated token",
            ["route", "model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter("smolgate_prompt_tokens", "Prompt tokens (input)", ["model"], registry=r)
        self.completion_tokens = Counter(
            "smolgate_completion_tokens", "Completion tokens (output)", ["model"], registry=r
        )
        self.cached_tokens = Counter(
            "smolgate_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            ["model"],
            registry=r,
        )
        if engine_stats is not None:
            r.register(EngineCollector(engine_stats))

    def observe(self, rec: RequestRecord) -> None:
        model = rec.model or "none"
        self.requests.labels(rec.route, model, str(rec.status)).inc()
        self.latency.labels(rec.route, model).observe(rec.latency_s)
        if rec.ttft_s is not None:
            self.ttft.labels(rec.route, model).observe(rec.ttft_s)
        if rec.prompt_tokens or rec.completion_tokens:
            self.prompt_tokens.labels(model).inc(rec.prompt_tokens)
            self.completion_tokens.labels(model).inc(rec.completion_tokens)
            self.cached_tokens.labels(model).inc(rec.cached_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
