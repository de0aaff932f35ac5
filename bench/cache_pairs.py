"""The labelled semantic-cache set (tests/data/semantic_cache_pairs.tsv) and its scoring.

`python -m bench.cache_pairs` sweeps the threshold (bench/results/cache_pairs.json; bench/plots.py plots it).

Every distinct cached question goes into one index (one scope: the hardest case); every incoming
question is looked up through the real matcher (cosine threshold + key-term guards). A hit is true
only when it returns the question's labelled paraphrase (or the same text); any other hit —
a hard negative's partner, or an unrelated entry — is a false hit.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.cache.semantic import match
from gateway.cache.stores import MemoryStore

PAIRS_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "semantic_cache_pairs.tsv"
Embed = Callable[[list[str]], Awaitable[list[list[float]]]]


@dataclass(frozen=True)
class Pair:
    label: str  # paraphrase | negative
    kind: str
    cached: str
    query: str


@dataclass(frozen=True)
class PairScore:
    pairs: int
    paraphrases: int
    paraphrase_hits: int
    hits: int
    false_hits: int
    false_examples: tuple[tuple[str, str, float], ...]
    missed_examples: tuple[tuple[str, str], ...]

    @property
    def paraphrase_hit_rate(self) -> float:
        return self.paraphrase_hits / self.paraphrases if self.paraphrases else 0.0

    @property
    def false_hit_rate(self) -> float:
        """False hits as a fraction of all hits."""
        return self.false_hits / self.hits if self.hits else 0.0


def load_pairs(path: Path = PAIRS_PATH) -> list[Pair]:
    pairs = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            label, kind, cached, query = line.split("\t")
            pairs.append(Pair(label, kind, cached, query))
    return pairs


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


async def score_pairs(pairs: list[Pair], embed: Embed, threshold: float, margin: float = 0.1) -> PairScore:
    equivalent = {(_norm(p.cached), _norm(p.query)) for p in pairs if p.label == "paraphrase"}
    cached = sorted({p.cached for p in pairs})
    queries = sorted({p.query for p in pairs})
    vectors = await embed(cached + queries)
    vec = dict(zip(cached + queries, vectors, strict=True))
    store = MemoryStore(max_entries=len(cached) + 1)
    for text in cached:
        await store.put(text, b"answer", 3600)
        await store.add_vector("scope", text, text, vec[text], 3600)
    hits = false_hits = paraphrase_hits = 0
    false_examples: list[tuple[str, str, float]] = []
    missed: list[tuple[str, str]] = []
    for p in pairs:
        found = await match(store, "scope", p.query, vec[p.query], threshold, margin)
        hit = found.hit
        if hit is not None:
            hits += 1
            right = _norm(hit.key) == _norm(p.query) or (_norm(hit.key), _norm(p.query)) in equivalent
            if not right:
                false_hits += 1
                false_examples.append((hit.key, p.query, round(hit.similarity, 3)))
            elif p.label == "paraphrase" and _norm(hit.key) == _norm(p.cached):
                paraphrase_hits += 1
        elif p.label == "paraphrase":
            missed.append((p.cached, p.query))
    paraphrases = sum(p.label == "paraphrase" for p in pairs)
    return PairScore(len(pairs), paraphrases, paraphrase_hits, hits, false_hits, tuple(false_examples), tuple(missed))


def score_with(embed_sync: Callable[[list[str]], tuple[list[list[float]], int]], threshold: float) -> PairScore:
    """Score with a synchronous embedder (backend.embeddings.Embedder.embed_sync)."""

    async def embed(texts: list[str]) -> list[list[float]]:
        return embed_sync(texts)[0]

    return asyncio.run(score_pairs(load_pairs(), embed, threshold))


# ---- python -m bench.cache_pairs: the hit rates across thresholds -----------------------------------

SWEEP = tuple(round(0.70 + 0.02 * i, 2) for i in range(15))  # 0.70 .. 0.98


def sweep(embed_sync: Callable[[list[str]], tuple[list[list[float]], int]], thresholds: tuple[float, ...]) -> list[dict]:
    """Paraphrase hit rate and false-hit share at every threshold (each text embedded once)."""
    memo: dict[str, list[float]] = {}

    def embed_once(texts: list[str]) -> tuple[list[list[float]], int]:
        fresh = [t for t in texts if t not in memo]
        if fresh:
            memo.update(zip(fresh, embed_sync(fresh)[0], strict=True))
        return [memo[t] for t in texts], 0

    rows = []
    for threshold in thresholds:
        score = score_with(embed_once, threshold)
        rows.append(
            {
                "threshold": threshold,
                "paraphrase_hit_rate": round(score.paraphrase_hit_rate, 4),
                "false_hit_rate": round(score.false_hit_rate, 4),
                "hits": score.hits,
                "false_hits": score.false_hits,
            }
        )
    return rows


def main() -> None:
    from backend.embeddings import Embedder, for_cache
    from bench.report import default_out, emit
    from gateway.cache.config import CacheConfig

    rows = sweep(for_cache(Embedder(batch_size=256), CacheConfig().embedding_dtype).embed_sync, SWEEP)  # the cache's
    for row in rows:
        rates = f"paraphrase hits {row['paraphrase_hit_rate']:6.1%}  false hits {row['false_hit_rate']:6.1%}"
        print(f"threshold {row['threshold']:.2f}  {rates}")
    pairs = load_pairs()
    result = {
        "bench": "cache_pairs",
        "pairs": len(pairs),
        "paraphrases": sum(p.label == "paraphrase" for p in pairs),
        "default_threshold": CacheConfig().similarity_threshold,
        "sweep": rows,
    }
    emit(result, default_out("cache_pairs"))


if __name__ == "__main__":
    main()
