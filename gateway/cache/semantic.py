"""Semantic lookup: embed the user's last message, search its scope, and accept a candidate only when

1. cosine >= threshold (the embedding finds candidates, it never decides alone),
2. the key-term guards agree (numbers, operators, names, opposed polarity words: gateway/cache/guards.py),
3. the lexical check (gateway/cache/lexical.py) finds the same content: every content word has a partner in the
   other question (the same word, or through WordNet a synonym, an inflection, a derivation, a similar adjective or
   a verb's hypernym), with the same negations, tense, kind of question and persons, and
   - the words keep their roles (SAME, REORDERED): served; with `cache.semantic_verify: all` the engine verifier
     confirms it first (gateway/cache/verify.py: one teacher-forced prefill);
   - the words swapped roles, or one word pair WordNet cannot relate and nothing opposes (SWAPPED, SUBSTITUTED):
     only the engine can tell, with its strict criterion; without a verifier (lexical mode: models the engine does
     not serve) never served;
4. optionally (`relevance_margin`), the cached answer relates to the new question about as well as to its own
   (gateway/cache/relevance.py).

With `cache.semantic_match: learned` steps 2 and 3 (and the engine verifier) give way to the learned matcher
(gateway/cache/matcher.py): every candidate from the matcher's floor up is scored by it, the guards and the lexical
verdict among its inputs, and the best-scoring one is served if its score reaches the calibrated threshold. With
`cache.semantic_match: union` a lookup the matcher does not serve goes on to steps 1-3 (never the engine verifier):
either may serve it, the matcher at a threshold calibrated on the union's hits.

The best rejected candidate comes back as `near_miss`: the extension point for speculative
decoding (a near miss's answer is a good draft for the engine, never served as the answer).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson

from gateway.cache import lexical
from gateway.cache.guards import same_key_terms
from gateway.cache.index import Candidate
from gateway.cache.matcher import QueryScorer
from gateway.cache.relevance import AnswerVector, relevant
from gateway.cache.stores import CacheStore
from gateway.client import EmbeddingClient
from gateway.ops.access_log import Logger

TOP_K = 8


@dataclass(frozen=True)
class NearMiss:
    candidate: Candidate
    # "threshold" (similar, not enough) | "guard" (a number, entity or negation differs) | "lexical" (a content word
    # differs, or the order differs with no verifier) | "relevance" (the cached answer relates less to the new
    # question than to its own) | "verifier" (the engine found the answer does not fit) | "matcher" (the learned
    # matcher scored it below its threshold)
    reason: str


@dataclass(frozen=True)
class SemanticMatch:
    hit: Candidate | None = None
    entry: bytes | None = None
    near_miss: NearMiss | None = None


async def embed_query(embedder: EmbeddingClient, text: str, logger: Logger) -> list[float] | None:
    """The query's unit vector; None (no semantic lookup) when the embedder cannot take it."""
    vectors = await embed_texts(embedder, [text], logger)
    return None if vectors is None else vectors[0]


async def embed_texts(embedder: EmbeddingClient, texts: list[str], logger: Logger) -> list[list[float]] | None:
    """Unit vectors of `texts` in one call; None when the embedder cannot take them."""
    try:
        vectors, _ = await embedder.embed(texts)
    except Exception as exc:  # e.g. longer than the embedding model reads: this request is just not matched
        logger.warning("cache_embedding_failed", error=type(exc).__name__, detail=str(exc)[:200])
        return None
    return vectors


# Given a candidate, its stored entry and whether the lexical check left it undecided (SWAPPED or SUBSTITUTED: the
# strict criterion): does its answer fit the new question? (None: no verifier, lexical mode)
Verify = Callable[[Candidate, bytes, bool], Awaitable[bool]]


async def match(
    store: CacheStore,
    scope: str,
    query: str,
    vector: list[float],
    *,
    threshold: float,
    margin: float,
    verify: Verify | None = None,
    relevance_margin: float | None = None,
    learned: QueryScorer | None = None,
) -> SemanticMatch:
    """The first candidate (best cosine first) that passes every check. `relevance_margin`: None skips the
    answer-relevance check; otherwise an entry stored without its answer's vector is never served. `learned`: the
    learned matcher, with `query` read, decides instead of the guards, the lexical check and the verifier; in its
    union with them (`learned.union`) what it does not serve goes on to the guards and the lexical check."""
    near: NearMiss | None = None
    if learned is not None:
        found = await _match_learned(store, scope, vector, learned, relevance_margin=relevance_margin)
        if found.hit is not None or not learned.union:
            return found
        near, verify = found.near_miss, None  # the union was calibrated without the engine
    for cand in await store.search(scope, vector, TOP_K, threshold - margin):
        if cand.similarity < threshold:
            near = near or NearMiss(cand, "threshold")
            continue
        if not same_key_terms(query, cand.text):
            near = near or NearMiss(cand, "guard")
            continue
        verdict = lexical.compare(query, cand.text)
        needs_engine = verdict in (lexical.SWAPPED, lexical.SUBSTITUTED)  # only the verifier can tell
        if verdict == lexical.DIFFERENT or (needs_engine and verify is None):
            near = near or NearMiss(cand, "lexical")
            continue
        entry = await store.get(cand.key)
        if entry is None:
            continue
        if relevance_margin is not None and not _relevant(entry, vector, relevance_margin):
            near = near or NearMiss(cand, "relevance")
            continue
        if verify is not None and not await verify(cand, entry, needs_engine):
            near = near or NearMiss(cand, "verifier")
            continue
        return SemanticMatch(cand, entry, near)
    return SemanticMatch(near_miss=near)


async def _match_learned(
    store: CacheStore, scope: str, vector: list[float], learned: QueryScorer, *, relevance_margin: float | None
) -> SemanticMatch:
    """The best-scoring candidate from the matcher's floor up, served if its score reaches the threshold."""
    candidates = await store.search(scope, vector, TOP_K, learned.floor)
    if not candidates:
        return SemanticMatch()
    scores = await learned.scores([(c.text, c.similarity) for c in candidates])
    ranked = sorted(zip(scores, range(len(candidates)), strict=True), key=lambda s: (-s[0], s[1]))
    near: NearMiss | None = None
    for score, i in ranked:
        cand = candidates[i]
        if score < learned.threshold:
            return SemanticMatch(near_miss=near or NearMiss(cand, "matcher"))
        entry = await store.get(cand.key)
        if entry is None:
            continue
        if relevance_margin is not None and not _relevant(entry, vector, relevance_margin):
            near = near or NearMiss(cand, "relevance")
            continue
        return SemanticMatch(cand, entry, near)
    return SemanticMatch(near_miss=near)


def _relevant(entry: bytes, vector: list[float], margin: float) -> bool:
    answer = AnswerVector.from_json(orjson.loads(entry).get("relevance"))
    return answer is not None and relevant(vector, answer, margin)
