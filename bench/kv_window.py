"""KV memory of a model that mixes full and sliding-window layers (Gemma 3 270M Q4_K_M by default): one pool for every
layer against the windowed layers' own pool (`engine.kv_window_pool`, backend/engine/kv_cache.py).

    python -m bench.kv_window [--model FILE.gguf] [--tokens 8000] [--new-tokens 16]

For each setting, one engine as `make serve` builds it (the default KV budget) serves one long prompt (the held-out text,
repeated to --tokens tokens), greedy. Reported: the blocks of each pool and the context tokens the budget holds (what
the full layers' pool holds; the windowed layers' pool holds a window per running sequence); the KV memory the
sequence held at its peak (its blocks in use, in bytes); the KV memory resident at the end (the pools are anonymous
memory maps, resident as far as written: their mappings' Rss in /proc/self/smaps; the free lists hand out the least
recently freed block first, to keep freed blocks findable by the prefix cache longest, so a pool's pages become
resident as its free list cycles through them, up to the pool's size); the time to the first token; and whether
both settings gave the same tokens. The last line printed
is one JSON object, also written to bench/results/kv_window.json.
"""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path
from typing import Any

import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from bench.report import default_out, emit


def resident_mb(tensor: torch.Tensor) -> float:
    """Resident memory (Rss) of the mapping holding `tensor`'s storage, MiB."""
    ptr = tensor.data_ptr()
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=1)[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= ptr < end
        elif inside and head == "Rss:":
            return int(line.split()[1]) / 1024
    return float("nan")


def serve(model: Path, prompt: list[int], new_tokens: int, *, window_pool: bool) -> dict[str, Any]:
    gc.collect()
    engine = LLMEngine(EngineConfig(model=str(model), kv_window_pool=window_pool))
    kv, runner = engine.kv, engine.runner
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    engine.add_request("long", prompt, params)
    start, ttft, tokens = time.perf_counter(), None, []
    pools = [(kv.pool, runner.kv_cache)] + ([(kv.window_pool, runner.window_cache)] if kv.window_pool is not None else [])
    peak = 0
    while engine.has_work:
        outs = engine.step()
        peak = max(peak, sum((p.num_blocks - p.num_free) * (t.nbytes // p.num_blocks) for p, t in pools if t is not None))
        for out in outs:
            tokens += [t for d in out.deltas for t in d.token_ids]
            if ttft is None and tokens:
                ttft = time.perf_counter() - start
    result = {
        "kv_blocks": kv.pool.num_blocks,
        "window_blocks": kv.window_pool.num_blocks if kv.window_pool is not None else 0,
        "context_tokens_budget": kv.pool.num_blocks * kv.block_size,
        "kv_budget_mb": round(runner.kv_bytes / 2**20, 1),
        "kv_held_peak_mb": round(peak / 2**20, 1),
        "kv_resident_mb": round(sum(resident_mb(t) for _, t in pools if t is not None), 1),
        "ttft_s": round(ttft or float("nan"), 2),
        "tokens": tokens,
    }
    del engine, runner, kv
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.kv_window", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a .gguf file (default: Gemma 3 270M Q4_K_M, fetched)")
    ap.add_argument("--tokens", type=int, default=8000, help="prompt length")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.model is None:
        from backend.fetch import fetch_gemma_gguf

        args.model = fetch_gemma_gguf()
    from backend.model.tokenizer import load_tokenizer
    from backend.model.weights import resolve_model_dir
    from backend.quant.calibration import HELDOUT

    tokenizer = load_tokenizer(resolve_model_dir(args.model, gguf_blocks=True))
    text = tokenizer.encode(HELDOUT.read_text(), add_special_tokens=False)
    prompt = (text * (args.tokens // len(text) + 1))[: args.tokens]
    runs = {}
    for name, split in (("one_pool", False), ("window_pool", True)):
        runs[name] = serve(args.model, prompt, args.new_tokens, window_pool=split)
        print(name, {k: v for k, v in runs[name].items() if k != "tokens"}, flush=True)
    one, own = runs["one_pool"], runs["window_pool"]
    result = {
        "bench": "kv_window", "model": args.model.name, "prompt_tokens": len(prompt), "new_tokens": args.new_tokens,
        "same_tokens": one["tokens"] == own["tokens"],
        **{name: {k: v for k, v in r.items() if k != "tokens"} for name, r in runs.items()},
        "context_budget_ratio": round(own["context_tokens_budget"] / one["context_tokens_budget"], 2),
        "held_ratio": round(own["kv_held_peak_mb"] / one["kv_held_peak_mb"], 3),
        "ttft_ratio": round(own["ttft_s"] / one["ttft_s"], 2),
    }
    emit(result, args.out or default_out("kv_window"))


if __name__ == "__main__":
    main()
