"""ResponseCache: built once per app from the configuration; hands each request a Ticket."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from backend.config import EngineConfig
from gateway.cache import lexical
from gateway.cache.config import CacheConfig
from gateway.cache.keys import model_fingerprint
from gateway.cache.matcher import LearnedMatcher, MatcherModel, TokenEmbedder
from gateway.cache.metrics import CacheMetrics
from gateway.cache.policy import CacheControl, take_control
from gateway.cache.sampled import SampledCheck
from gateway.cache.stores import CacheStore, MemoryStore, SafeStore, describe
from gateway.cache.tenancy import request_namespace
from gateway.cache.thresholds import EntryThresholds
from gateway.cache.ticket import CacheParts, Ticket
from gateway.cache.verify import Criterion, EngineVerifier
from gateway.client import EmbeddingClient, EngineClient
from gateway.config import GatewayConfig
from gateway.ids import IdGenerator
from gateway.ops.access_log import Logger
from gateway.protocol.sse import StreamLimits

_WARN_EVERY_S = 10.0
_RECORDS_PER_ENTRY = 8  # a shared outcome log keeps about this many outcomes per cache entry (then the oldest go)


class ResponseCache:
    def __init__(
        self,
        cfg: CacheConfig,
        store: CacheStore | None,
        embedder: EmbeddingClient | None,
        metrics: CacheMetrics,
        *,
        logger: Logger,
        ids: IdGenerator,
        fingerprint: str,
        stream_limits: StreamLimits,
        verifier: EngineVerifier | None = None,
        learned: LearnedMatcher | None = None,
    ) -> None:
        """`verifier`: scores semantic candidates with the embedded engine; None = the lexical check alone.
        `learned`: the learned matcher (`cache.semantic_match: learned` or `union`), which then decides every
        candidate (with `union`, together with the lexical check)."""
        self.cfg = cfg
        self.store = SafeStore(store, self.backend_error, cfg.redis_retry_s) if store is not None else None
        self.embedder = embedder if cfg.semantic else None
        self.metrics = metrics
        self.logger = logger
        self.ids = ids
        self.fingerprint = fingerprint
        self.stream_limits = stream_limits
        self.learned = learned if self.embedder is not None else None
        self.verifier = verifier if self.embedder is not None and self.learned is None else None
        # per-entry records of verified outcomes; with them a candidate may skip the engine (gateway/cache/thresholds.py)
        self.thresholds = self._record("engine", cfg.error_bound) if (
            self.verifier is not None and cfg.error_bound > 0) else None  # fmt: skip
        # third-party models' hits, a share compared with the provider's fresh answer (gateway/cache/sampled.py)
        self.upstream_check = SampledCheck(cfg.upstream_sample, cfg.upstream_agreement, self._record("upstream", 0.0)) if (
            self.embedder is not None and cfg.upstream_sample > 0) else None  # fmt: skip
        self.sampled: SampledCheck | None = None  # the embedded model's hits: the engine verifier's
        self._last_warning = -_WARN_EVERY_S
        self._last_tenant_warning = -_WARN_EVERY_S

    def _record(self, name: str, delta: float) -> EntryThresholds:
        """Per-entry outcomes, shared by the replicas through the store when it can share them (Redis)."""
        shared = getattr(self.store.inner if self.store is not None else None, "outcomes", None)
        log = shared(name, _RECORDS_PER_ENTRY * self.cfg.max_entries, self.cfg.max_ttl_s) if shared else None
        return EntryThresholds(delta, entries=self.cfg.max_entries, log=log, on_error=lambda e: self.backend_error("outcomes", e))

    def ticket(
        self, endpoint: str, headers: Mapping[str, str], body: dict[str, Any], upstream: str | None = None
    ) -> Ticket:
        """Takes the `cache` extension out of `body` (always, so the parser never sees it). `upstream`: the
        fingerprint of a routed model that third-party APIs serve (keys.upstream_fingerprint): its entries are keyed
        by it, and the engine never verifies them (it does not serve that model): the lexical check alone decides."""
        control = take_control(body, headers, self.cfg.max_ttl_s)
        parts: CacheParts = self if upstream is None else _Upstream(self, upstream)
        ns = request_namespace(headers, self.cfg.tenant_secret)
        if ns is None:  # a tenant header this process cannot verify: no lookup, no store
            self._unverified_tenant()
            return Ticket(parts, endpoint, CacheControl(lookup=False, store=False, semantic=False), "unverified")
        return Ticket(parts, endpoint, control, ns)

    def _unverified_tenant(self) -> None:
        now = time.monotonic()
        if now - self._last_tenant_warning >= _WARN_EVERY_S:
            self._last_tenant_warning = now
            self.logger.warning(
                "cache_tenant_unverified",
                detail="a request named a tenant without a valid signature: not cached (a router and its backends need "
                "the same SMOLGATE_CACHE_TENANT_SECRET)",
            )

    def backend_error(self, op: str, exc: BaseException | None) -> None:
        self.metrics.backend_errors.labels(op).inc()
        now = time.monotonic()
        if exc is not None and now - self._last_warning >= _WARN_EVERY_S:
            self._last_warning = now
            self.logger.warning("cache_backend_unavailable", op=op, backend=self.cfg.backend, **describe(exc))

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


class _Upstream:
    """The cache as a third-party model's requests see it: the same store, embedder and metrics, that model's
    fingerprint, no engine verifier, and the sampled check (when `cache.upstream_sample` is set)."""

    verifier = None
    thresholds = None

    def __init__(self, cache: ResponseCache, fingerprint: str) -> None:
        self.cfg, self.store, self.embedder, self.metrics = cache.cfg, cache.store, cache.embedder, cache.metrics
        self.learned = cache.learned
        self.logger, self.ids, self.stream_limits = cache.logger, cache.ids, cache.stream_limits
        self.fingerprint = fingerprint
        self.sampled = cache.upstream_check


def criterion_of(cfg: CacheConfig) -> Criterion:
    return Criterion(cfg.verify_max_drop, cfg.verify_mean_drop, cfg.verify_reordered_max_drop, cfg.verify_reordered_mean_drop,
                     cfg.verify_min_greedy, cfg.verify_max_tokens)  # fmt: skip


def make_store(cfg: CacheConfig) -> CacheStore | None:
    if cfg.backend == "memory":
        return MemoryStore(cfg.max_entries)
    if cfg.backend == "redis":
        from gateway.cache.redis_store import RedisStore  # only deployments that use Redis import it

        return RedisStore(cfg.redis_url, cfg.key_prefix, cfg.max_entries, cfg.redis_timeout_s)
    return None


def build_cache(
    config: GatewayConfig,
    model_id: str,
    embedder: EmbeddingClient | None,
    metrics: CacheMetrics,
    *,
    logger: Logger,
    ids: IdGenerator,
    store: CacheStore | None = None,
    resolved: Mapping[str, Any] | None = None,
    engine: EngineClient | None = None,
    engine_config: EngineConfig | None = None,
) -> ResponseCache:
    """`store` overrides the configured backend (tests wrap a real store to inject faults); `resolved`: the engine's
    `output_identity` (its `auto` settings as resolved on this machine), part of the model fingerprint; `engine` (an
    EngineClient serving `model_id`, or None) verifies semantic candidates unless `cache.semantic_verify` is lexical.
    `engine_config`: that engine's settings (default `config.engine`; a `models:` list entry has its own)."""
    cfg = config.cache
    fingerprint = model_fingerprint(model_id, engine_config or config.engine, cfg.fingerprint, resolved)
    chosen = store if store is not None else make_store(cfg)
    if cfg.semantic and embedder is not None and not lexical.default_lexicon():  # loaded now, not on a first request
        logger.warning("cache_wordnet_missing", detail="run `python -m gateway.cache.wordnet_fetch`: without WordNet the "
                       "lexical check knows no synonyms (fewer semantic hits, never more)")  # fmt: skip
    learned = build_matcher(cfg, embedder, logger)
    verifier = None
    if engine is not None and model_id and cfg.semantic and cfg.semantic_verify != "lexical" and learned is None:
        verifier = EngineVerifier(engine, criterion_of(cfg), ids.new)
    limits = StreamLimits.of(config)
    return ResponseCache(cfg, chosen, embedder, metrics, logger=logger, ids=ids, fingerprint=fingerprint, stream_limits=limits,
        verifier=verifier, learned=learned)


def build_matcher(cfg: CacheConfig, embedder: EmbeddingClient | None, logger: Logger) -> LearnedMatcher | None:
    """The learned matcher when `cache.semantic_match` is learned or union and the embedder can hand it token states."""
    if not (cfg.semantic and cfg.semantic_match in ("learned", "union") and embedder is not None):
        return None
    if not isinstance(embedder, TokenEmbedder):
        raise ValueError(f"cache.semantic_match: {cfg.semantic_match} needs an embedder with token states "
                         "(all-MiniLM-L6-v2 as the gateway loads it)")  # fmt: skip
    model = MatcherModel.load()
    if model.encoder is not None and f"+{model.encoder_digest}/" not in embedder.identity:
        raise ValueError(f"cache.semantic_match: {cfg.semantic_match} needs the cache's embedder with the matcher's "
                         f"fine-tuned layers ({model.encoder.name}); this one is {embedder.identity}")  # fmt: skip
    return LearnedMatcher(model, embedder, cfg.matcher_threshold, union=cfg.semantic_match == "union")
