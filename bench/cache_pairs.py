"""The labelled semantic-cache set (tests/data/semantic_cache_pairs.tsv) and its scoring.

`python -m bench.cache_pairs` sweeps the threshold (bench/results/cache_pairs.json; bench/plots.py plots it).

Every distinct cached question goes into one index (one scope: the hardest case); every incoming
question is looked up through the real matcher (cosine threshold + key-term guards). A hit is true
only when it returns the question's labelled paraphrase (or the same text); any other hit —
a hard negative's partner, or an unrelated entry — is a false hit.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.cache.matcher import norm
from gateway.cache.semantic import match
from gateway.cache.stores import MemoryStore
from gateway.cache.train import AnswerKey, Pair, read_pairs

PAIRS_PATH = Path(__file__).resolve().parents[1] / "tests" / "data" / "semantic_cache_pairs.tsv"
SPLITS_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "cache_pairs"  # dev.tsv (tune) and test.tsv
Embed = Callable[[list[str]], Awaitable[list[list[float]]]]


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
    """Every pair of a file (gateway/cache/train.py's reader; held-out sets too: this scores, it does not train)."""
    return read_pairs(path)


async def score_pairs(pairs: list[Pair], embed: Embed, threshold: float, margin: float = 0.1) -> PairScore:
    right_answer = AnswerKey(pairs)
    cached = sorted({p.cached for p in pairs})
    queries = sorted({p.query for p in pairs})
    vectors = await embed(cached + queries)
    vec = dict(zip(cached + queries, vectors, strict=True))
    store = MemoryStore(max_entries=len(cached) + 1)
    for text in cached:
        await store.put(text, b"answer", 3600)
        await store.add_vector("scope", text, text, vec[text], ttl_s=3600)
    hits = false_hits = paraphrase_hits = 0
    false_examples: list[tuple[str, str, float]] = []
    missed: list[tuple[str, str]] = []
    for p in pairs:
        found = await match(store, "scope", p.query, vec[p.query], threshold=threshold, margin=margin)
        hit = found.hit
        if hit is not None:
            hits += 1
            right = right_answer(hit.key, p.query)
            if not right:
                false_hits += 1
                false_examples.append((hit.key, p.query, round(hit.similarity, 3)))
            elif p.label == "paraphrase" and norm(hit.key) == norm(p.cached):
                paraphrase_hits += 1
        elif p.label == "paraphrase":
            missed.append((p.cached, p.query))
    paraphrases = sum(p.label == "paraphrase" for p in pairs)
    return PairScore(len(pairs), paraphrases, paraphrase_hits, hits, false_hits, tuple(false_examples), tuple(missed))


def score_with(embed_sync: Callable[[list[str]], tuple[list[list[float]], int]], threshold: float) -> PairScore:
    """Score with a synchronous embedder (backend.embed.embeddings.Embedder.embed_sync)."""

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


def lookups_to_json(lookups: list[Lookup]) -> list[dict]:
    return [{"pair": dataclasses.asdict(look.pair), "examined": [dataclasses.asdict(e) for e in look.examined],
             "nearest": look.nearest, "considered": look.considered} for look in lookups]  # fmt: skip


def lookups_from_json(rows: list[dict]) -> list[Lookup]:
    def ex(e: dict) -> Examined:
        new = None if e["new"] is None else tuple(e["new"])
        greedy = None if e.get("greedy") is None else tuple(e["greedy"])
        return Examined(e["cached"], e["similarity"], e["verdict"], e["right"], tuple(e["original"]), new, greedy,
                        e.get("answer_new"), e.get("answer_orig"))  # fmt: skip

    def near(raw: list | None) -> tuple[str, float, bool] | None:
        return None if raw is None else (raw[0], float(raw[1]), bool(raw[2]))

    return [Lookup(Pair(**r["pair"]), tuple(ex(e) for e in r["examined"]), near(r.get("nearest")),
                   tuple(tuple(c) for c in r.get("considered", ()))) for r in rows]  # type: ignore[misc]  # fmt: skip


def calibrate(out: Path, floor: float) -> None:
    """Collect the dev split and the old labelled set with the engine (bench/results/cache_calibration.json), then
    print the sweep of thresholds and criteria. Tuning happens here, on dev only: the test split is never read."""
    import json

    sets = {"dev": SPLITS_DIR / "dev.tsv", "old": PAIRS_PATH}
    data = json.loads(out.read_text()) if out.exists() else {}
    for name, path in sets.items():
        if name not in data:
            data[name] = lookups_to_json(asyncio.run(evaluate(path, floor)))
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("w") as f:  # the calibration cache (dev only), not a result: bench.report.emit writes those
                json.dump(data, f)
    print_sweep({name: lookups_from_json(rows) for name, rows in data.items()})


RELEVANCE_MARGINS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.08, 0.1)


def print_sweep(sets: dict[str, list[Lookup]]) -> None:
    from gateway.cache.verify import Criterion

    for threshold in (0.70, 0.75, 0.80, 0.86):
        for name, lookups in sets.items():
            print(name, score_lookups(lookups, "lexical", threshold).as_dict())
            for margin in RELEVANCE_MARGINS:  # the answer-relevance check on top of the lexical one
                row = score_lookups(lookups, "lexical", threshold, relevance_margin=margin).as_dict()
                print(f"  relevance_margin={margin}: {row['paraphrase_hit_rate']:.3f}/{row['false_hits']}/{row['hits']}")
        for max_drop in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0):
            for mean_drop in (0.05, 0.1, 0.15, 0.2, 0.3):
                crit = Criterion(max_drop, mean_drop)
                row = [score_lookups(lookups, "verified", threshold, crit).as_dict() for lookups in sets.values()]
                cells = "  ".join(f"{r['paraphrase_hit_rate']:.3f}/{r['false_hits']}/{r['hits']}" for r in row)
                print(f"t={threshold:.2f} max={max_drop} mean={mean_drop}  {cells}")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.cache_pairs")
    parser.add_argument("--calibrate", action="store_true", help="collect dev + the old set with the engine, sweep")
    parser.add_argument("--floor", type=float, default=0.70)
    args = parser.parse_args()
    if args.calibrate:
        calibrate(Path(__file__).parent / "results" / "cache_calibration.json", args.floor)
        return

    from backend.embed.embeddings import Embedder, for_cache
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



# ---- the full mechanism: cosine + guards + lexical check + engine verification ------------------------------------
#
# One pass with the real engine collects, for every incoming question, every candidate the matcher would examine
# (cosine >= a floor, guards and the lexical check passed) with its verifier scores; any threshold and criterion is
# then scored from those records without the engine. `python -m bench.cache_pairs --calibrate` sweeps them on dev.


# answers are generated this long: what the relevance check embeds (gateway/cache/relevance.py's excerpt) is the
# opening of a typical answer, not of the verifier's 32 scored tokens
ANSWER_TOKENS = 64


@dataclass(frozen=True)
class Examined:
    """One candidate the matcher reached for one incoming question."""

    cached: str
    similarity: float
    verdict: str  # lexical.SAME | lexical.REORDERED
    right: bool  # serving it would be a correct answer
    original: tuple[float, ...]  # answer-token log-probabilities under the cached question
    new: tuple[float, ...] | None  # ... under the incoming question (None: the engine could not score it)
    greedy: tuple[bool, ...] | None = None  # whether each is the incoming question's greedy choice
    answer_new: float | None = None  # cos(incoming question, the cached answer's excerpt): gateway/cache/relevance.py
    answer_orig: float | None = None  # cos(cached question, its answer's excerpt)


@dataclass(frozen=True)
class Lookup:
    pair: Pair
    examined: tuple[Examined, ...]  # best first
    nearest: tuple[str, float, bool] | None = None  # the most similar cached question, its cosine, and if right
    # every cached question above the floor, whatever the checks said: (cached, cosine, stage it reached, right,
    # answer_new, answer_orig); stage is "guard" | "lexical" | a lexical verdict. For studying the checks on dev.
    considered: tuple[tuple[str, float, str, bool, float, float], ...] = ()


@dataclass(frozen=True)
class MechanismScore:
    mode: str  # lexical | verified
    threshold: float
    paraphrases: int
    paraphrase_hits: int
    hits: int
    false_hits: int
    verifications: int  # prefills the verifier ran

    @property
    def paraphrase_hit_rate(self) -> float:
        return self.paraphrase_hits / self.paraphrases if self.paraphrases else 0.0

    @property
    def false_hit_rate(self) -> float:
        return self.false_hits / self.hits if self.hits else 0.0

    def as_dict(self) -> dict:
        return {
            "mode": self.mode, "threshold": self.threshold, "paraphrases": self.paraphrases,
            "paraphrase_hits": self.paraphrase_hits, "paraphrase_hit_rate": round(self.paraphrase_hit_rate, 4),
            "hits": self.hits, "false_hits": self.false_hits, "false_hit_rate": round(self.false_hit_rate, 4),
            "verifications": self.verifications,
        }  # fmt: skip


async def collect(pairs: list[Pair], engine: object, embed: Embed, floor: float, *, max_tokens: int = 64) -> list[Lookup]:
    """Generate every cached question's answer with the engine (greedy, as the cache stores it, with its tokens'
    log-probabilities; ANSWER_TOKENS long, of which the verifier scores the first `max_tokens`), embed each answer's
    excerpt (gateway/cache/relevance.py), index the questions in one scope, and look every incoming question up
    through the real matcher with a verifier that scores (and records) each candidate it is handed."""
    import orjson

    from backend.engine.sampling_params import SamplingParams
    from gateway.cache import lexical
    from gateway.cache.guards import same_key_terms
    from gateway.cache.relevance import cosine, excerpt
    from gateway.cache.semantic import TOP_K
    from gateway.cache.verify import Answer, Criterion, EngineVerifier
    from gateway.protocol.generation import collect as drain

    is_right = AnswerKey(pairs)
    cached = sorted({p.cached for p in pairs})
    queries = sorted({p.query for p in pairs})
    prompt = {q: engine.apply_chat_template([{"role": "user", "content": q}]) for q in cached + queries}  # type: ignore[attr-defined]
    params = SamplingParams(temperature=0.0, max_tokens=max(max_tokens, ANSWER_TOKENS), logprobs=0)

    async def answer(i: int, q: str) -> tuple[Answer, str]:
        gen = await drain(engine.generate(prompt[q], params, f"bench-gen-{i}"), lambda: None)  # type: ignore[attr-defined]
        choice = gen.ordered()[0]
        return Answer(tuple(choice.token_ids), tuple(lp.logprob for lp in choice.logprobs)), "".join(choice.text)

    generated = await asyncio.gather(*(answer(i, q) for i, q in enumerate(cached)))
    answers = {q: a for q, (a, _) in zip(cached, generated, strict=True)}
    vectors = await embed(cached + queries + [excerpt(text) for _, text in generated])
    questions = cached + queries
    vec = dict(zip(questions, vectors[: len(questions)], strict=True))
    avec = dict(zip(cached, vectors[len(questions) :], strict=True))
    store = MemoryStore(max_entries=len(cached) + 1)
    for text in cached:
        await store.put(text, orjson.dumps({"query": text, "answer": answers[text].to_json()}), 3600)
        await store.add_vector("scope", text, text, vec[text], ttl_s=3600)
    counter = iter(range(10**9))
    verifier = EngineVerifier(engine, Criterion(max_tokens=max_tokens), lambda: str(next(counter)))

    async def look(p: Pair) -> Lookup:
        seen: list[Examined] = []

        async def record(_: object, entry: bytes, swapped: bool) -> bool:
            text = orjson.loads(entry)["query"]
            new = await verifier.score(prompt[p.query], answers[text].token_ids)
            right = is_right(text, p.query)
            sim = cosine(vec[text], vec[p.query])
            verdict = lexical.compare(p.query, text)
            lps, greedy = (None, None) if new is None else (new.logprobs, new.greedy)
            seen.append(Examined(text, sim, verdict, right, answers[text].logprobs, lps, greedy,
                                 cosine(vec[p.query], avec[text]), cosine(vec[text], avec[text])))  # fmt: skip
            return False  # reject every candidate, so all of them are examined

        await match(store, "scope", p.query, vec[p.query], threshold=floor, margin=0.0, verify=record)
        top = await store.search("scope", vec[p.query], TOP_K, floor)
        nearest = None
        if top:
            nearest = (top[0].key, float(top[0].similarity), is_right(top[0].key, p.query))
        considered = []
        for cand in top:
            text = cand.key
            stage = "guard" if not same_key_terms(p.query, text) else lexical.compare(p.query, text)
            considered.append((text, float(cand.similarity), stage, is_right(text, p.query),
                               cosine(vec[p.query], avec[text]), cosine(vec[text], avec[text])))  # fmt: skip
        return Lookup(p, tuple(seen), nearest, tuple(considered))

    return list(await asyncio.gather(*(look(p) for p in pairs)))


def score_lookups(
    lookups: list[Lookup], mode: str, threshold: float, criterion: object = None, *, relevance_margin: float | None = None
) -> MechanismScore:
    """What the matcher serves at `threshold`: embedding mode, the nearest cached question (cosine alone); lexical
    mode, the first SAME or REORDERED candidate; verified mode (`cache.semantic_verify: auto`), the first SAME or
    REORDERED candidate, or SWAPPED or SUBSTITUTED one the strict criterion accepts; verified_all mode
    (`semantic_verify: all`), the first candidate the criterion accepts (strictly for SWAPPED and SUBSTITUTED ones).
    Each candidate the engine scores costs a verification. With `relevance_margin`, lexical and verified modes first
    drop candidates whose answer fails the relevance check (gateway/cache/relevance.py), as the matcher does."""
    from gateway.cache import lexical
    from gateway.cache.verify import Scores

    hits = false_hits = paraphrase_hits = verifications = 0
    for look in lookups:
        if mode == "embedding":  # the nearest cached question above the threshold, nothing else checked
            near = look.nearest
            if near is None or near[1] < threshold:
                continue
            hits += 1
            false_hits += not near[2]
            paraphrase_hits += near[2] and look.pair.label == "paraphrase" and norm(near[0]) == norm(look.pair.cached)
            continue
        served = None
        for ex in look.examined:
            if ex.similarity < threshold:
                continue
            if relevance_margin is not None and not _relevant(ex, relevance_margin):
                continue
            decided = ex.verdict in (lexical.SAME, lexical.REORDERED)
            if mode == "lexical" or (mode == "verified" and decided):
                if decided:
                    served = ex
                    break
                continue
            verifications += 1
            strict = ex.verdict in (lexical.SWAPPED, lexical.SUBSTITUTED)
            scores = None if ex.new is None else Scores(ex.new, ex.greedy or (True,) * len(ex.new))
            if scores is not None and criterion.accept(ex.original, scores, strict):  # type: ignore[attr-defined]
                served = ex
                break
        if served is None:
            continue
        hits += 1
        if not served.right:
            false_hits += 1
        elif look.pair.label == "paraphrase" and norm(served.cached) == norm(look.pair.cached):
            paraphrase_hits += 1
    paraphrases = sum(look.pair.label == "paraphrase" for look in lookups)
    return MechanismScore(mode, threshold, paraphrases, paraphrase_hits, hits, false_hits, verifications)


def _relevant(ex: Examined, margin: float) -> bool:
    if ex.answer_new is None or ex.answer_orig is None:  # recorded before the check existed: never served
        return False
    from gateway.cache.relevance import passes

    return passes(ex.answer_new, ex.answer_orig, margin)


async def evaluate(path: Path, floor: float, max_tokens: int = 64) -> list[Lookup]:
    """`collect` on one split with the engine and the cache's embedder as the gateway builds them (SMOLGATE_* apply)."""
    import os

    from backend.config import EngineConfig
    from backend.embed.embeddings import Embedder, for_cache
    from backend.engine.async_engine import AsyncEngine
    from gateway.config import GatewayConfig, apply_env

    # room for every question's answer at once (a few hundred sequences): no preemption and recompute
    config = apply_env(GatewayConfig(engine=EngineConfig(max_model_len=2048, kv_cache_memory_mb=2048)), os.environ)
    engine = AsyncEngine.from_config(config.engine)
    embedder = for_cache(Embedder(batch_size=256, executor=engine), config.cache.embedding_dtype)

    async def embed(texts: list[str]) -> list[list[float]]:
        return (await embedder.embed(texts))[0]

    try:
        return await collect(load_pairs(path), engine, embed, floor, max_tokens=max_tokens)
    finally:
        await engine.shutdown()


if __name__ == "__main__":
    main()


# ---- the sampled check for third-party models: do two answers agree? ------------------------------------------------
#
# gateway/cache/sampled.py compares a provider's fresh answer with the cached one (cosine of their embedded openings).
# Here both questions of every pair at or above the similarity threshold are answered by one model, and the answers'
# cosine is scored: how many paraphrase pairs agree, how many look-alike pairs disagree, at each agreement threshold.

AGREEMENT_SWEEP = (0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
Answerer = Callable[[list[str]], Awaitable[list[str]]]


async def agreement(path: Path, answer: Answerer, embed: Embed, threshold: float) -> dict[str, Any]:
    """`answer`: the model under test, every question at once (greedy, ANSWER_TOKENS); aggregates only."""
    from gateway.cache.relevance import cosine, excerpt

    pairs = load_pairs(path)
    questions = sorted({p.cached for p in pairs} | {p.query for p in pairs})
    vectors = await embed(questions)
    qv = dict(zip(questions, vectors, strict=True))
    close = [p for p in pairs if cosine(qv[p.cached], qv[p.query]) >= threshold]
    asked = sorted({q for p in close for q in (p.cached, p.query)})
    texts = await answer(asked)
    av = dict(zip(asked, await embed([excerpt(t) for t in texts]), strict=True))
    right = [cosine(av[p.cached], av[p.query]) for p in close if p.label == "paraphrase"]
    wrong = [cosine(av[p.cached], av[p.query]) for p in close if p.label != "paraphrase"]
    auc = sum((r > w) + 0.5 * (r == w) for r in right for w in wrong) / max(len(right) * len(wrong), 1)
    sweep = [{"agreement": t, "paraphrases_agreeing": round(sum(r >= t for r in right) / max(len(right), 1), 4),
              "look_alikes_disagreeing": round(sum(w < t for w in wrong) / max(len(wrong), 1), 4)}
             for t in AGREEMENT_SWEEP]  # fmt: skip
    return {"pairs_file": path.name, "threshold": threshold, "paraphrase_pairs": len(right), "look_alike_pairs": len(wrong),
            "auc": round(auc, 4), "sweep": sweep}  # fmt: skip
