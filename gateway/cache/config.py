"""CacheConfig: the `cache:` section of the gateway configuration (frozen, validated at startup)."""

from __future__ import annotations

from dataclasses import dataclass, field

BACKENDS = ("memory", "redis", "off")
# What the semantic cache embeds with: the /v1/embeddings embedder (same), any embedding dtype, or auto (int8 where the
# C kernels build, else same). Resolved by the composition root (gateway/__main__.py), which may import torch.
EMBEDDING_DTYPES = ("auto", "same", "float32", "bfloat16", "float16", "int8")
# How a semantic candidate is confirmed (docs/caching.md): auto = the lexical check decides, and the embedded engine
# (when it serves the model) scores the cached answer under the new question (one prefill) only for the candidates
# the words cannot decide (roles swapped, or one word WordNet cannot relate); all = the engine scores every
# candidate (and per-entry thresholds, `error_bound`, may skip it); lexical = never ask the engine.
VERIFY_MODES = ("auto", "all", "lexical")
# What decides a semantic candidate (docs/caching.md): lexical = the key-term guards and the WordNet lexical check
# (then the verifier, per semantic_verify); learned = the learned, calibrated matcher (gateway/cache/matcher.py),
# which reads those signals as features; union = served if the learned matcher (at its union threshold) or the guards
# and the lexical check accept (no engine verifier).
MATCH_MODES = ("lexical", "learned", "union")


@dataclass(frozen=True)
class CacheConfig:
    backend: str = "memory"  # memory (in-process) | redis (shared by replicas) | off
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_timeout_s: float = 0.25  # per Redis command; beyond it the request goes on uncached
    redis_retry_s: float = 1.0  # after a Redis error, skip Redis this long (requests stay uncached)
    key_prefix: str = "smolgate"  # Redis key prefix
    ttl_s: int = 3600  # default entry lifetime; a request may ask for another
    max_ttl_s: int = 86400  # the longest TTL a request may ask for
    max_entries: int = 10000  # in-process LRU size (and per-scope vector index size)
    only_deterministic: bool = True  # cache only temperature 0 or seeded requests
    # Also cache routed models that third-party APIs serve (gateway/routing/cached.py). Off by default: a provider's
    # answers are replayed only when the operator asks for it (as LiteLLM's and Portkey's caches are opt-in).
    upstream: bool = False
    # Their semantic hits (gateway/cache/sampled.py): the share sent to the provider anyway, whose fresh answer is
    # compared with the cached one (cosine of the answers' embedded openings; agreement at or above
    # upstream_agreement). An entry whose answer disagreed is not served again at that similarity or below.
    upstream_sample: float = 0.0
    upstream_agreement: float = 0.8
    # Off by default: match paraphrases of the last user message (docs/caching.md gives the measured hit rate and
    # wrong-answer share on held-out and independent question pairs).
    semantic: bool = False
    similarity_threshold: float = 0.70  # cosine (all-MiniLM-L6-v2) at or above which a candidate is examined
    near_miss_margin: float = 0.1  # candidates this far below the threshold are counted as near misses
    semantic_multi_turn: bool = False  # allow semantic hits for conversations (earlier turns stay in the key)
    embedding_dtype: str = "auto"  # the semantic cache's embedder: EMBEDDING_DTYPES
    semantic_verify: str = "auto"  # VERIFY_MODES (lexical matching only)
    semantic_match: str = "lexical"  # MATCH_MODES
    # learned (and union) matching: serve at or above this matcher score; 0 = the threshold calibrated with the shipped
    # matcher (gateway/cache/matcher.json: wrong hits at most 1% at 95% confidence on the calibration split, when
    # reachable; for the union, on the union's hits)
    matcher_threshold: float = 0.0
    # The verifier's criterion (gateway/cache/verify.py), calibrated on tests/data/cache_pairs/dev.tsv: the largest
    # single-token and the mean drop in log-probability (nats) of the cached answer under the new question, for
    # candidates whose content words keep their roles (a safety net: the lexical check vouches for them), and much
    # stricter when the words swapped roles (on dev role reversals lost no more than paraphrases did: only a nearly
    # unchanged answer passes). Lower = fewer wrong answers and fewer hits.
    verify_max_drop: float = 6.0
    verify_mean_drop: float = 0.35
    verify_reordered_max_drop: float = 0.5
    verify_reordered_mean_drop: float = 0.05
    verify_min_greedy: float = 0.5  # the share of scored answer tokens that must be the new question's greedy choice
    verify_max_tokens: int = 32  # answer tokens scored (the first ones): the verifier's prefill grows with each
    # Answer-conditioned relevance (gateway/cache/relevance.py): serve a candidate only if the cached answer's embedding
    # is at most relevance_margin less similar to the new question than to the question it answered (calibrated on
    # tests/data/cache_pairs/dev.tsv). Needs no engine: it applies to every model.
    relevance: bool = False
    relevance_margin: float = 0.02
    # Per-entry thresholds (gateway/cache/thresholds.py): a candidate skips the engine verifier when its entry's own
    # verified outcomes bound the chance of a wrong answer at its similarity by error_bound (95% confidence).
    # 0 = verify every candidate.
    error_bound: float = 0.0
    fingerprint: str = ""  # extra model fingerprint: change it when weights change under the same path
    # Shared by a router and its backend replicas (env SMOLGATE_CACHE_TENANT_SECRET only, never the file): the router
    # signs each request's tenant namespace with it, a backend trusts only a signed one (gateway/cache/tenancy.py).
    tenant_secret: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"cache.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.embedding_dtype not in EMBEDDING_DTYPES:
            raise ValueError(f"cache.embedding_dtype must be one of {EMBEDDING_DTYPES}, got {self.embedding_dtype!r}")
        if self.semantic_match not in MATCH_MODES:
            raise ValueError(f"cache.semantic_match must be one of {MATCH_MODES}, got {self.semantic_match!r}")
        if not 0.0 <= self.matcher_threshold <= 1.0:
            raise ValueError("cache.matcher_threshold must be in [0, 1] (0: the calibrated threshold)")
        if self.semantic_verify not in VERIFY_MODES:
            raise ValueError(f"cache.semantic_verify must be one of {VERIFY_MODES}, got {self.semantic_verify!r}")
        drops = (self.verify_max_drop, self.verify_mean_drop, self.verify_reordered_max_drop, self.verify_reordered_mean_drop)
        if min(drops) < 0:
            raise ValueError("cache.verify_*_drop thresholds must be non-negative")
        if not 0.0 <= self.relevance_margin <= 2.0:
            raise ValueError("cache.relevance_margin must be in [0, 2] (a difference of cosines)")
        if not 0.0 <= self.error_bound < 1.0:
            raise ValueError("cache.error_bound must be in [0, 1)")
        if not 0.0 <= self.verify_min_greedy <= 1.0 or self.verify_max_tokens < 1:
            raise ValueError("cache.verify_min_greedy must be in [0, 1] and cache.verify_max_tokens positive")
        if not 0.0 <= self.upstream_sample <= 1.0 or not -1.0 <= self.upstream_agreement <= 1.0:
            raise ValueError("cache.upstream_sample must be in [0, 1] and cache.upstream_agreement in [-1, 1]")
        if not 0.0 < self.similarity_threshold <= 1.0:
            raise ValueError("cache.similarity_threshold must be in (0, 1]")
        if self.ttl_s < 1 or self.max_ttl_s < 1 or self.max_entries < 1:
            raise ValueError("cache.ttl_s, cache.max_ttl_s and cache.max_entries must be positive")

    @property
    def enabled(self) -> bool:
        return self.backend != "off"
