"""Prometheus metrics: one registry per app (no process-global state), engine gauges at scrape time."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.engine.outputs import EngineStats
from gateway.ops.record import RequestRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
Labels = tuple[tuple[str, str], ...]
Family = GaugeMetricFamily | CounterMetricFamily  # the kinds of engine series, each built with labels, added to by sample
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class EngineCollector(Collector):
    """Reads engine.stats() on every scrape: queue depth, KV usage, prefix-cache hits. Several engines (the `models:`
    list): each series once per engine, labelled with its model; one engine: unlabelled, as always."""

    def __init__(self, stats: Callable[[], EngineStats] | Mapping[str, Callable[[], EngineStats]]) -> None:
        self._stats: Mapping[str, Callable[[], EngineStats]] = {"": stats} if callable(stats) else stats

    def collect(self) -> Iterator[Metric]:
        labelled = len(self._stats) > 1 or "" not in self._stats
        families: dict[str, Family] = {}

        def add(kind: type[Family], name: str, doc: str, model: str, *, value: float | None, labels: Labels = ()) -> None:
            family = families.get(name)
            if family is None:
                names = (["model"] if labelled else []) + [k for k, _ in labels]
                family = families[name] = kind(name, doc, labels=names)
            if value is not None:
                family.add_metric(([model] if labelled else []) + [v for _, v in labels], value)

        for model, read in self._stats.items():
            try:
                s = read()
            except Exception:
                add(GaugeMetricFamily, "smolgate_engine_up", "1 when the engine answers stats()", model, value=0)
                continue
            add(GaugeMetricFamily, "smolgate_engine_up", "1 when the engine answers stats()", model, value=1)
            for kind, name, doc, value, labels in _engine_series(s):
                add(kind, name, doc, model, value=value, labels=labels)
        yield from families.values()


def _engine_series(s: EngineStats) -> Iterator[tuple[type[Family], str, str, float | None, Labels]]:
    """(family, name, help, value, extra labels) of every engine series; value None: the family, with no sample yet."""
    g, c = GaugeMetricFamily, CounterMetricFamily
    yield g, "smolgate_engine_waiting_requests", "Queue depth: requests waiting", s.num_waiting, ()
    yield g, "smolgate_engine_running_requests", "Requests running", s.num_running, ()
    yield g, "smolgate_kv_cache_blocks_used", "KV cache blocks in use", s.kv_blocks_used, ()
    yield g, "smolgate_kv_cache_blocks_total", "KV cache blocks in the pool", s.kv_blocks_total, ()
    usage = s.kv_blocks_used / s.kv_blocks_total if s.kv_blocks_total else 0.0
    yield g, "smolgate_kv_cache_usage_ratio", "Fraction of KV blocks in use", usage, ()
    yield c, "smolgate_prefix_cache_queries", "Prefix-cache block lookups", s.prefix_cache_queries, ()
    yield c, "smolgate_prefix_cache_hits", "Prefix-cache block hits", s.prefix_cache_hits, ()
    yield c, "smolgate_engine_prompt_tokens", "Prompt tokens the engine processed", s.prompt_tokens_total, ()
    yield c, "smolgate_engine_generation_tokens", "Tokens the engine generated", s.generation_tokens_total, ()
    yield c, "smolgate_engine_preemptions", "Sequences preempted", s.num_preemptions, ()
    yield c, "smolgate_spec_proposed_tokens", "Speculative draft tokens proposed", None, (("source", ""),)  # no sample
    yield c, "smolgate_spec_accepted_tokens", "Speculative draft tokens accepted", None, (("source", ""),)
    for source, counts in sorted(s.spec_sources.items()):
        yield c, "smolgate_spec_proposed_tokens", "Speculative draft tokens proposed", counts.proposed, (("source", source),)
        yield c, "smolgate_spec_accepted_tokens", "Speculative draft tokens accepted", counts.accepted, (("source", source),)
    for key, value in sorted(s.extra.items()):
        yield g, "smolgate_engine_" + re.sub(r"[^a-zA-Z0-9_]", "_", key), f"Engine statistic {key}", value, ()


@dataclass(frozen=True)
class _Series:
    requests: Counter
    latency: Histogram
    ttft: Histogram
    prompt_tokens: Counter
    completion_tokens: Counter
    cached_tokens: Counter


class GatewayMetrics:
    """Per-request counters and histograms, plus the engine collector, in a private registry."""

    def __init__(self, engine_stats: Callable[[], EngineStats] | Mapping[str, Callable[[], EngineStats]] | None) -> None:
        """`engine_stats`: the engine's stats(), or several engines' by model id (each labelled with it)."""
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter("smolgate_requests", "HTTP requests", ["route", "model", "status"], registry=r)
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
        self.completion_tokens = Counter("smolgate_completion_tokens", "Completion tokens (output)", ["model"], registry=r)
        self.cached_tokens = Counter(
            "smolgate_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache",
            ["model"],
            registry=r,
        )
        if engine_stats is not None:
            r.register(EngineCollector(engine_stats))
        self._cache: dict[tuple[str, str, int], _Series] = {}

    def observe(self, rec: RequestRecord) -> None:
        series = self._series(rec.route, rec.model or "none", rec.status)
        series.requests.inc()
        series.latency.observe(rec.latency_s)
        if rec.ttft_s is not None:
            series.ttft.observe(rec.ttft_s)
        if rec.prompt_tokens or rec.completion_tokens:
            series.prompt_tokens.inc(rec.prompt_tokens)
            series.completion_tokens.inc(rec.completion_tokens)
            series.cached_tokens.inc(rec.cached_tokens)

    def _series(self, route: str, model: str, status: int) -> _Series:
        """Labelled children, cached: labels() is the slow part of prometheus_client."""
        key = (route, model, status)
        series = self._cache.get(key)
        if series is None:
            series = self._cache[key] = _Series(
                requests=self.requests.labels(route, model, str(status)),
                latency=self.latency.labels(route, model),
                ttft=self.ttft.labels(route, model),
                prompt_tokens=self.prompt_tokens.labels(model),
                completion_tokens=self.completion_tokens.labels(model),
                cached_tokens=self.cached_tokens.labels(model),
            )
        return series

    def render(self) -> bytes:
        return generate_latest(self.registry)
