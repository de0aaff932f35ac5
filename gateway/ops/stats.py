"""LiveStats: what the dashboard shows, as one JSON snapshot (GET /v1/stats).

Prometheus (/metrics) keeps cumulative counters and bucketed histograms for scrapers; the dashboard
wants live figures instead: exact percentiles over the last minute, tokens/s over the last seconds,
requests in flight, per-model and per-key traffic and the last errors. The middleware feeds every
finished request here; the engine and the cache counters are read when a snapshot is asked for.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from backend.engine.outputs import EngineStats
from gateway.ops.record import RequestRecord

WINDOW_S = 60.0  # latency percentiles cover the requests that finished in the last minute
RATE_WINDOW_S = 10.0  # tokens/s and requests/s cover the last ten seconds
MAX_SAMPLES = 20_000
MAX_ERRORS = 20
MAX_LABELS = 256  # per-key and per-model tables stop growing here (a flood of unknown model names)
_CACHE_RESULTS = ("hit", "semantic-hit", "miss", "bypass")


@dataclass(frozen=True)
class _Sample:
    t: float  # time.monotonic() when the request finished
    latency_s: float
    ttft_s: float | None
    completion_tokens: int
    ok: bool


@dataclass
class _Traffic:
    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, rec: RequestRecord) -> None:
        self.requests += 1
        self.errors += rec.status >= 400
        self.prompt_tokens += rec.prompt_tokens
        self.completion_tokens += rec.completion_tokens


@dataclass
class LiveStats:
    started: float = field(default_factory=time.monotonic)
    in_flight: int = 0  # /v1/ requests the middleware admitted and has not finished
    rejected: int = 0  # /v1/ requests turned away with 429 by the admission limit
    total: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # "2xx" -> count
    cache: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_CACHE_RESULTS, 0))
    models: dict[str, _Traffic] = field(default_factory=dict)
    keys: dict[str, _Traffic] = field(default_factory=dict)
    samples: deque[_Sample] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    errors: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_ERRORS))

    def observe(self, rec: RequestRecord) -> None:
        """One finished /v1/ request (the caller leaves out the dashboard's own polling, health checks, scrapes)."""
        now = time.monotonic()
        self.total += 1
        klass = f"{rec.status // 100}xx" if rec.status else "none"
        self.statuses[klass] = self.statuses.get(klass, 0) + 1
        if rec.cache in self.cache:
            self.cache[rec.cache] += 1
        if rec.model:
            _traffic(self.models, rec.model).add(rec)
        _traffic(self.keys, rec.key).add(rec)
        ok = 0 < rec.status < 400
        self.samples.append(_Sample(now, rec.latency_s, rec.ttft_s, rec.completion_tokens, ok))
        if not ok:
            self.errors.appendleft(
                {
                    "time": time.time(),
                    "request_id": rec.request_id,
                    "path": rec.path,
                    "status": rec.status,
                    "error": rec.error_type or "",
                    "model": rec.model,
                }
            )

    def snapshot(self, engine: EngineStats | None, registry: CollectorRegistry) -> dict[str, Any]:
        now = time.monotonic()
        window = [s for s in self.samples if now - s.t <= WINDOW_S]
        recent = [s for s in window if now - s.t <= RATE_WINDOW_S]
        ok = [s for s in window if s.ok]
        return {
            "uptime_s": round(now - self.started, 1),
            "process": {"rss_bytes": rss_bytes(), "pid": os.getpid()},
            "requests": {
                "total": self.total,
                "in_flight": self.in_flight,
                "rejected_429": self.rejected,
                "by_status": dict(self.statuses),
                "per_s": round(len(recent) / RATE_WINDOW_S, 3),
                "completion_tokens_per_s": round(sum(s.completion_tokens for s in recent) / RATE_WINDOW_S, 2),
            },
            "latency_s": percentiles([s.latency_s for s in ok]),
            "ttft_s": percentiles([s.ttft_s for s in ok if s.ttft_s is not None]),
            "engine": engine_figures(engine),
            "cache": self._cache_figures(registry),
            "models": {k: vars(v) for k, v in self.models.items()},
            "keys": {k: vars(v) for k, v in self.keys.items()},
            "recent_errors": list(self.errors),
        }

    def _cache_figures(self, registry: CollectorRegistry) -> dict[str, Any]:
        looked_up = self.cache["hit"] + self.cache["semantic-hit"] + self.cache["miss"]
        saved = {
            kind: registry.get_sample_value("smolgate_cache_tokens_saved_total", {"kind": kind}) or 0.0
            for kind in ("prompt", "completion")
        }
        return {
            "hits": self.cache["hit"],
            "semantic_hits": self.cache["semantic-hit"],
            "misses": self.cache["miss"],
            "bypassed": self.cache["bypass"],
            "hit_rate": round((self.cache["hit"] + self.cache["semantic-hit"]) / looked_up, 4) if looked_up else 0.0,
            "tokens_saved": {k: int(v) for k, v in saved.items()},
        }


def _traffic(table: dict[str, _Traffic], label: str) -> _Traffic:
    entry = table.get(label)
    if entry is None:
        label = label if len(table) < MAX_LABELS else "(other)"
        entry = table.setdefault(label, _Traffic())
    return entry


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """p50/p90/p99 by the nearest-rank method; None while there is nothing to rank."""
    ordered = sorted(values)
    n = len(ordered)

    def rank(p: float) -> float | None:
        return round(ordered[min(n - 1, max(0, int(p * n + 0.5) - 1))], 4) if n else None

    return {"count": n, "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99)}


def engine_figures(s: EngineStats | None) -> dict[str, Any] | None:
    if s is None:
        return None
    proposed = s.extra.get("spec_proposed_tokens", 0.0)
    accepted = s.extra.get("spec_accepted_tokens", 0.0)
    return {
        "running": s.num_running,
        "waiting": s.num_waiting,
        "kv_blocks_used": s.kv_blocks_used,
        "kv_blocks_total": s.kv_blocks_total,
        "kv_usage": round(s.kv_blocks_used / s.kv_blocks_total, 4) if s.kv_blocks_total else 0.0,
        "prefix_cache_hit_rate": round(s.prefix_cache_hits / s.prefix_cache_queries, 4) if s.prefix_cache_queries else 0.0,
        "generation_tokens_per_s": round(s.extra.get("generation_tokens_per_s", 0.0), 2),
        "prompt_tokens_total": s.prompt_tokens_total,
        "generation_tokens_total": s.generation_tokens_total,
        "preemptions": s.num_preemptions,
        "spec_proposed_tokens": int(proposed),
        "spec_accepted_tokens": int(accepted),
        "spec_acceptance_rate": round(accepted / proposed, 4) if proposed else None,
    }


def rss_bytes() -> int | None:
    """This process's resident set size (Linux /proc; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
