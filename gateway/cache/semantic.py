"""Semantic lookup: embed the user's last message, search its scope, and accept a candidate only when

1. cosine >= threshold (the embedding finds candidates, it never decides alone),
2. the key-term guards agree (numbers, operators, negations: gateway/cache/guards.py),
3. the lexical check passes (gateway/cache/lexical.py): every content word has a partner in the other question
   (the same word, or through WordNet a synonym, an inflection, a derivation or a direct hypernym),
4. the cached answer relates to the new question about as well as to its own (gateway/cache/relevance.py; when
   `relevance_margin` is given), and
5. either the words keep their roles (the same order, or one phrase moved with its preposition) and nothing can
   verify (lexical mode: models the engine cannot score), or the engine verifier accepts the cached answer under
   the new question (gateway/cache/verify.py: one teacher-forced prefill), strictly when the words swapped roles.

The best rejected candidate comes back as `near_miss`: the extension point for speculative
decoding (a near miss's answer is a good draft for the engine, never served as the answer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.cache import lexical
from gateway.cache.guards import same_key_terms
from gateway.cache.index import Candidate
from gateway.cache.relevance import AnswerVector, relevant
from gateway.cache.stores import CacheStore
from gateway.client import EmbeddingClient

TOP_K = 8


@dataclass(frozen=True)
class NearMiss:
    candidate: Candidate
    # "threshold" (similar, not enough) | "guard" (a number, entity or negation differs) | "lexical" (a content word
    # differs, or the order differs with no verifier) | "relevance" (the cached answer relates less to the new
    # question than to its own) | "verifier" (the engine found the answer does not fit)
    reason: str


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


# Given a candidate, its stored entry and whether its content words swapped roles (the strict criterion): does its
# answer fit the new question? (None: no verifier, lexical mode)
Verify = Callable[[Candidate, bytes, bool], Awaitable[bool]]


async def match(
    store: CacheStore,
    scope: str,
    query: str,
    vector: list[float],
    threshold: float,
    margin: float,
    verify: Verify | None = None,
    relevance_margin: float | None = None,
) -> SemanticMatch:
    """The first candidate (best cosine first) that passes every check. `relevance_margin`: None skips the
    answer-relevance check; otherwise an entry stored without its answer's vector is never served."""
    near: NearMiss | None = None
    for cand in await store.search(scope, vector, TOP_K, threshold - margin):
        if cand.similarity < threshold:
            near = near or NearMiss(cand, "threshold")
            continue
        if not same_key_terms(query, cand.text):
            near = near or NearMiss(cand, "guard")
            continue
        verdict = lexical.compare(query, cand.text)
        if verdict == lexical.DIFFERENT or (verdict == lexical.SWAPPED and verify is None):
            near = near or NearMiss(cand, "lexical")
            continue
        entry = await store.get(cand.key)
        if entry is None:
            continue
        if relevance_margin is not None and not _relevant(entry, vector, relevance_margin):
            near = near or NearMiss(cand, "relevance")
            continue
        if verify is not None and not await verify(cand, entry, verdict == lexical.SWAPPED):
            near = near or NearMiss(cand, "verifier")
            continue
        return SemanticMatch(cand, entry, near)
    return SemanticMatch(near_miss=near)


def _relevant(entry: bytes, vector: list[float], margin: float) -> bool:
    answer = AnswerVector.from_json(orjson.loads(entry).get("relevance"))
    return answer is not None and relevant(vector, answer, margin)
