"""The response cache, measured: labelled-set quality, lookup cost at scale, and hit/miss latency
through the full HTTP path with the real engine and embedder.

    python -m bench.cache [--hits 200] [--misses 10] [--only quality|lookup|http]

1. quality: tests/data/semantic_cache_pairs.tsv scored with all-MiniLM-L6-v2 at the default
   threshold, with the cache's embedder (`cache.embedding_dtype`: int8 where the C kernels build;
   SMOLGATE_CACHE_* variables apply) (paraphrase hit rate; false hits as a share of all hits);
2. lookup: exact get and semantic match (search + guards + get) in an in-process store holding
   10k and 100k entries in one scope (random unit vectors: the worst case, one matrix product);
3. HTTP: a real gateway (real engine, embedders as `python -m gateway` builds them, in-process cache;
   SMOLGATE_* variables apply, e.g. SMOLGATE_CACHE_EMBEDDING_DTYPE=same) in a subprocess, driven over one
   keep-alive connection: an exact hit, a semantic hit (a paraphrase), and a miss (a fresh question,
   64 generated tokens: ignore_eos).
The last line of output is one JSON object (also bench/results/cache.json; with --only PART, cache_PART.json).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.cache_pairs import score_with
from bench.report import default_out, emit
from bench.server import free_port, wait_ready
from gateway.cache.semantic import match
from gateway.cache.stores import MemoryStore

API_KEY = "sk-bench-cache"
DIM = 384
PARAPHRASES = ["What's the capital of France?", "Tell me the capital city of France.", "What is France's capital?"]


def _pct(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"p50_ms": round(statistics.median(ordered) * 1000, 3), "p99_ms": round(p99 * 1000, 3), "n": len(ordered)}


def quality() -> dict[str, Any]:
    from backend.embeddings import Embedder, for_cache
    from gateway.config import GatewayConfig, apply_env

    cfg = apply_env(GatewayConfig(), os.environ).cache  # SMOLGATE_CACHE_EMBEDDING_DTYPE=same: the /v1/embeddings one
    embedder = for_cache(Embedder(batch_size=256), cfg.embedding_dtype)
    score = score_with(embedder.embed_sync, cfg.similarity_threshold)
    return {
        "embedder": embedder.identity, "threshold": cfg.similarity_threshold, "pairs": score.pairs,
        "paraphrases": score.paraphrases, "paraphrase_hit_rate": round(score.paraphrase_hit_rate, 4), "hits": score.hits,
        "false_hits": score.false_hits, "false_hit_rate": round(score.false_hit_rate, 4),
    }  # fmt: skip


async def _lookup_at(entries: int, queries: int = 200) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((entries, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    store = MemoryStore(max_entries=entries)
    for i in range(entries):
        await store.put(f"k{i}", b"answer", 3600)
        await store.add_vector("scope", f"k{i}", f"question number {i}", vectors[i].tolist(), 3600)
    exact, semantic = [], []
    for q in range(queries):
        i = int(rng.integers(entries))
        noisy = vectors[i] + 0.01 * rng.standard_normal(DIM).astype(np.float32)
        query = (noisy / np.linalg.norm(noisy)).tolist()
        t0 = time.perf_counter()
        await store.get(f"k{i}")
        t1 = time.perf_counter()
        found = await match(store, "scope", f"question number {i}", query, 0.86, 0.1)
        t2 = time.perf_counter()
        assert found.hit is not None and found.hit.key == f"k{i}", q
        exact.append(t1 - t0)
        semantic.append(t2 - t1)
    return {"entries": entries, "exact_get": _pct(exact), "semantic_match": _pct(semantic)}


def lookups() -> list[dict[str, Any]]:
    return [asyncio.run(_lookup_at(n)) for n in (10_000, 100_000)]


# ---- the HTTP path -------------------------------------------------------------------------------


def serve(port: int) -> None:
    import uvicorn

    from backend.async_engine import AsyncEngine
    from backend.config import EngineConfig
    from gateway.__main__ import build_embedders
    from gateway.app import build_context, create_app
    from gateway.config import GatewayConfig, apply_env

    defaults = GatewayConfig(engine=EngineConfig(max_model_len=2048, kv_cache_memory_mb=256))
    config = dataclasses.replace(apply_env(defaults, os.environ), api_keys=(API_KEY,))
    sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the server process
    engine = AsyncEngine.from_config(config.engine)
    embedder, cache_embedder = build_embedders(config, engine)
    app = create_app(build_context(config, engine, embedder, log_sink=sink, cache_embedder=cache_embedder))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _body(question: str, max_tokens: int = 64, **kw: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": question}]
    return {"model": "gpt-4o-mini", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **kw}


def _timed(client: httpx.Client, body: dict[str, Any], expect: str) -> float:
    t0 = time.perf_counter()
    resp = client.post("/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - t0
    resp.raise_for_status()
    if resp.headers["x-cache"] != expect:
        raise RuntimeError(f"expected x-cache {expect}, got {resp.headers['x-cache']} for {body['messages']}")
    return elapsed


def http_path(port: int, hits: int, misses: int) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=300) as client:
        for _ in range(3):  # warm-up: model, embedder, connection
            _timed(client, _body(f"Warm up {uuid.uuid4().int % 10**6}", 8), "miss")
        _timed(client, _body("What is the capital of France?"), "miss")
        exact = [_timed(client, _body("What is the capital of France?"), "hit") for _ in range(hits)]
        semantic = [_timed(client, _body(PARAPHRASES[i % 3]), "semantic-hit") for i in range(hits)]
        fresh = [_body(f"Write a story about the number {uuid.uuid4().int % 10**9}.", ignore_eos=True) for _ in range(misses)]
        miss = [_timed(client, body, "miss") for body in fresh]
    out = {"exact_hit": _pct(exact), "semantic_hit": _pct(semantic), "miss_64_tokens": _pct(miss)}
    out["hit_over_generation_p50"] = round(out["semantic_hit"]["p50_ms"] / out["miss_64_tokens"]["p50_ms"], 4)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cache")
    parser.add_argument("--hits", type=int, default=200)
    parser.add_argument("--misses", type=int, default=10)
    parser.add_argument("--only", choices=["quality", "lookup", "http"], help="run one part (default: all three)")
    parser.add_argument("--out", type=Path, help="result JSON (default bench/results/cache.json, cache_PART.json)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return
    result: dict[str, Any] = {}
    if args.only in (None, "quality"):
        result["quality"] = quality()
        print("quality:", result["quality"], flush=True)
    if args.only in (None, "lookup"):
        result["lookup"] = lookups()
        for row in result["lookup"]:
            print("lookup:", row, flush=True)
    out = args.out or default_out("cache" if args.only is None else f"cache_{args.only}")
    if args.only not in (None, "http"):
        emit({"bench": "cache", **result}, out)
        return
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.cache", "--serve", str(port)])
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc)
        result["http"] = http_path(port, args.hits, args.misses)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("http:", result["http"], flush=True)
    emit({"bench": "cache", **result}, out)


if __name__ == "__main__":
    main()
