"""The KV pool's dtype, side by side: two engines in one process, one decode step each in turn.

    python -m bench.kv_dtype --batch 32 --steps 120      # the serving configuration (AWQ)
    python -m bench.kv_dtype --batch 32 --quantization none

Both engines get the same `batch` greedy requests (the throughput bench's questions) and step
alternately, so they see the same contexts growing at the same moments of a noisy machine; only the
ratio means anything. Reported: step time p50 over all steps and over the first and last third (the KV
gather grows with the context), and the blocks each pool holds for the same budget. Last line: one JSON
object (also bench/results/kv_dtype.json).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from bench.profile_step import start_requests, warm_up
from bench.report import emit

DEFAULT_OUT = Path(__file__).parent / "results" / "kv_dtype.json"


def alternate(engines: dict[str, LLMEngine], steps: int) -> dict[str, list[float]]:
    """Milliseconds of each engine's steps, one step of each in turn."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(steps):
        for name, engine in engines.items():
            start = time.perf_counter()
            engine.step()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def summary(engine: LLMEngine, times: list[float]) -> dict[str, Any]:
    third = max(len(times) // 3, 1)
    return {
        "kv_dtype": str(engine.runner.kv_cache.dtype).removeprefix("torch."),
        "kv_blocks": engine.kv.pool.num_blocks,
        "step_ms_p50": round(statistics.median(times), 1),
        "first_third_ms": round(statistics.median(times[:third]), 1),
        "last_third_ms": round(statistics.median(times[-third:]), 1),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.kv_dtype", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--quantization", default="auto", choices=["auto", "awq", "none"])
    p.add_argument("--dtypes", default="float32,bfloat16", help="the two kv_cache_dtype values compared")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    engines = {
        name: LLMEngine(EngineConfig(quantization=args.quantization, kv_cache_dtype=name, kv_cache_memory_mb=512))
        for name in args.dtypes.split(",")
    }
    for engine in engines.values():
        start_requests(engine, args.batch, max_tokens=args.steps + 16)
        warm_up(engine)
    times = alternate(engines, args.steps)
    rows = {name: summary(engines[name], t) for name, t in times.items()}
    for name, row in rows.items():
        print(f"kv {name:<9} blocks {row['kv_blocks']:>6}  step p50 {row['step_ms_p50']:>7.1f} ms  "
              f"first third {row['first_third_ms']:>7.1f}  last third {row['last_third_ms']:>7.1f}")
    first, second = (rows[name]["step_ms_p50"] for name in engines)
    result = {"bench": "kv_dtype", "batch": args.batch, "quantization": args.quantization, "steps": args.steps,
              "engines": rows, "step_time_ratio": round(second / first, 3)}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
