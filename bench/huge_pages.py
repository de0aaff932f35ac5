"""The LM head's weights on 2 MB pages against 4 KB ones: two engines in one process, stepping alternately.

    python -m bench.huge_pages --model FILE.gguf          # Gemma 3 270M's 166 MB head: 32 streams and 1
    python -m bench.huge_pages                            # SmolLM2 (the default model)

Engine "huge" loads as served (`huge_pages: true`: backend/quant/huge_pages.py advises and collapses the head's
weights into 2 MB pages where Linux allows it), engine "small" with `huge_pages: false`; speculation off in both, so
each step is one token a sequence. The two step alternately on the same requests (the throughput bench's questions),
so they see the same contexts at the same moments of a noisy machine: only the ratio means anything. Reported per
batch: each engine's median step, and small / huge. Also how much of the head went onto huge pages (0 where the
kernel declines: THP `never`, or Linux before 6.1). Last line: one JSON object (also bench/results/huge_pages.json).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.quant.huge_pages import head_tensors, huge_page_kb
from bench.kv_dtype import alternate
from bench.profile_step import start_requests, warm_up
from bench.report import emit

DEFAULT_OUT = Path(__file__).parent / "results" / "huge_pages.json"


def head_on_huge_pages_mb(engine: LLMEngine) -> float:
    """MB of the head's tensors that lie in huge pages."""
    storages = [t.untyped_storage() for t in head_tensors(engine.runner.model.lm_head)]
    return round(huge_page_kb((s.data_ptr(), s.data_ptr() + s.nbytes()) for s in storages) / 1024, 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.huge_pages", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="", help="HF model dir or .gguf (default: the fetched SmolLM2)")
    p.add_argument("--batches", default="32,1")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    rows: dict[str, Any] = {}
    model = ""
    for batch in [int(b) for b in args.batches.split(",")]:
        engines = {}
        for name, huge in (("small", False), ("huge", True)):
            config = EngineConfig(model=args.model, enable_prefix_caching=False, num_speculative_tokens=0,
                                  huge_pages=huge)
            engine = LLMEngine(config)
            start_requests(engine, batch, max_tokens=args.steps + 32)
            warm_up(engine)
            engines[name] = engine
        model = engines["huge"].model_name
        times = alternate(engines, args.steps)
        p50 = {name: round(statistics.median(t), 2) for name, t in times.items()}
        rows[str(batch)] = {"step_ms_p50": p50, "small_over_huge": round(p50["small"] / p50["huge"], 3),
                            "head_on_huge_pages_mb": {n: head_on_huge_pages_mb(e) for n, e in engines.items()}}
        print(f"batch {batch:3d}: step {p50['small']} ms on 4 KB pages, {p50['huge']} on 2 MB "
              f"(x{rows[str(batch)]['small_over_huge']})", flush=True)
        del engines
    return emit({"bench": "huge_pages", "model": model, "steps": args.steps, "batches": rows}, args.out)


if __name__ == "__main__":
    main()
