"""The router's Prometheus series, in the gateway's registry; deployment gauges read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.routing.balancer import Balancer

_DECISION_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05)


class DeploymentCollector(Collector):
    def __init__(self, balancers: Callable[[], Mapping[str, Balancer]]) -> None:
        self._balancers = balancers

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "smolgate_router_deployment_available", "1 unless the deployment cools down", labels=["model", "deployment"]
        )
        busy = GaugeMetricFamily(
            "smolgate_router_outstanding_requests", "Requests in flight per deployment", labels=["model", "deployment"]
        )
        now = time.monotonic()
        for model, balancer in self._balancers().items():
            for s in balancer.states:
                up.add_metric([model, s.name], 1.0 if s.available(now) else 0.0)
                busy.add_metric([model, s.name], s.outstanding)
        yield up
        yield busy


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, balancers: Callable[[], Mapping[str, Balancer]]) -> None:
        r = registry
        self.attempts = Counter(
            "smolgate_router_attempts", "Upstream attempts by outcome", ["model", "deployment", "outcome"], registry=r
        )
        self.retries = Counter("smolgate_router_retries", "Attempts after a failed one", ["model"], registry=r)
        self.fallbacks = Counter(
            "smolgate_router_fallbacks", "Requests handed to a fallback model", ["model", "fallback"], registry=r
        )
        self.cooldowns = Counter("smolgate_router_cooldowns", "Deployments put in cooldown", ["model", "deployment"], registry=r)
        self.exhausted = Counter(
            "smolgate_router_exhausted", "Requests every deployment and fallback failed", ["model"], registry=r
        )
        self.rate_limited = Counter(
            "smolgate_router_rate_limited", "Requests refused or rerouted by a limit", ["scope"], registry=r
        )
        self.auto = Counter("smolgate_router_auto_choices", "model=auto decisions", ["tier", "model"], registry=r)
        self.prefix = Counter(
            "smolgate_router_prefix_affinity", "Affinity routing: hit (replica served this prefix before), miss, overloaded",
            ["result"], registry=r,
        )  # fmt: skip
        self.decision = Histogram(
            "smolgate_router_decision_seconds", "Time to pick a deployment", buckets=_DECISION_BUCKETS, registry=r
        )
        r.register(_HitRate(self.prefix))
        r.register(DeploymentCollector(balancers))


class _HitRate(Collector):
    """smolgate_router_prefix_hit_ratio = hits / affinity-routed requests, for dashboards without PromQL."""

    def __init__(self, prefix: Counter) -> None:
        self._prefix = prefix

    def collect(self) -> Iterator[Metric]:
        counts = {s.labels["result"]: s.value for m in self._prefix.collect() for s in m.samples if s.name.endswith("_total")}
        total = sum(counts.values())
        yield GaugeMetricFamily(
            "smolgate_router_prefix_hit_ratio", "Prefix-affinity hit rate", value=counts.get("hit", 0) / total if total else 0.0
        )
