"""Response-cache metrics, registered in the app's private Prometheus registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lookups = Counter(
            "smolgate_cache_lookups",
            "Response-cache outcomes: hit, semantic_hit, miss, bypass (not cacheable or skipped by the request)",
            ["endpoint", "result"],
            registry=registry,
        )
        self.near_misses = Counter(
            "smolgate_cache_near_misses",
            "Semantic candidates rejected: below the threshold (within the margin), by a key-term guard, by the lexical "
            "check or by the engine verifier",
            ["reason"],
            registry=registry,
        )
        self.verifications = Counter(
            "smolgate_cache_verifications",
            "Semantic candidates the engine scored under the new question (one prefill each): accepted or rejected; "
            "skipped: served without the engine, the entry's verified record bounding the error (cache.error_bound); "
            "third-party models: sample (a hit sent to the provider anyway), agreed / disagreed (its answer against the "
            "cached one), blocked (the entry's answer disagreed before at this similarity or above)",
            ["outcome"],
            registry=registry,
        )
        self.tokens_saved = Counter(
            "smolgate_cache_tokens_saved",
            "Tokens the engine did not process because the answer came from the cache",
            ["kind"],
            registry=registry,
        )
        self.stores = Counter("smolgate_cache_stores", "Responses written to the cache", ["endpoint"], registry=registry)
        self.backend_errors = Counter(
            "smolgate_cache_backend_errors",
            "Cache backend calls that failed or were skipped while the backend rested (requests went on uncached)",
            ["op"],
            registry=registry,
        )

    def lookup(self, endpoint: str, result: str) -> None:
        self.lookups.labels(endpoint, result.replace("-", "_")).inc()

    def saved(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.tokens_saved.labels("prompt").inc(prompt_tokens)
        self.tokens_saved.labels("completion").inc(completion_tokens)
