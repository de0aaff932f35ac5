"""Semantic lookup: embed the user's last message, search its scope, and accept a candidate only
when cosine >= threshold AND the key-term guards agree (numbers, entities, negations...).

The best rejected candidate comes back as `near_miss`: the extension point for speculative
decoding (a near miss's answer is a good draft for the engine, never served as the answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.cache.guards import same_key_terms
from gateway.cache.index import Candidate
from gateway.cache.stores import CacheStore
from gateway.client import EmbeddingClient

TOP_K = 8


@dataclass(frozen=True)
class NearMiss:
    candidate: Candidate
    reason: str  # "threshold" (similar, not enough) | "guard" (a number, entity or negation differs)


@dataclass(frozen=True)
class SemanticMatch:
    hit: Candidate | None = None
    entry: bytes | None = None
    near_miss: NearMiss | None = None


async def embed_query(embedder: EmbeddingClient, text: str, logger: Any) -> list[float] | None:
    """The query's unit vector; None (no semantic lookup) when the embedder cannot take it."""
    try:
        vectors, _ = await embedder.embed([text])
    except Exception as exc:  # e.g. longer than the embedding model reads: this request is just not matched
        logger.warning("cache_embedding_failed", error=type(exc).__name__, detail=str(exc)[:200])
        return None
    return vectors[0]


async def match(
    store: CacheStore, scope: str, query: str, vector: list[float], threshold: float, margin: float
) -> SemanticMatch:
    near: NearMiss | None = None
    for cand in await store.search(scope, vector, TOP_K, threshold - margin):
        if cand.similarity < threshold:
            near = near or NearMiss(cand, "threshold")
            continue
        if not same_key_terms(query, cand.text):
            near = near or NearMiss(cand, "guard")
            continue
        entry = await store.get(cand.key)
        if entry is not None:
            return SemanticMatch(cand, entry, near)
    return SemanticMatch(near_miss=near)
