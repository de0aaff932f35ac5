"""Prometheus series for batch lines, in the gateway's registry (GET /metrics)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry, queued: Callable[[], int], running: Callable[[], int]) -> None:
        self.queued = Gauge("smolgate_batch_lines_queued", "Batch lines waiting to run", registry=registry)
        self.queued.set_function(queued)
        self.running = Gauge("smolgate_batch_lines_running", "Batch lines in flight", registry=registry)
        self.running.set_function(running)
        self.done = Counter("smolgate_batch_lines_done", "Batch lines finished, by result", ["result"], registry=registry)
        self.preempted = Counter(
            "smolgate_batch_lines_preempted", "Batch lines aborted for live traffic (run again later)", registry=registry
        )
        self.batches = Counter("smolgate_batches", "Batches that reached a final status", ["status"], registry=registry)
