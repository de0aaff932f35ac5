"""Where one engine step goes: time decode steps at a given batch size and group the CPU time by op.

    python -m bench.profile_step --batch 32 --quantization auto    # the serving configuration
    python -m bench.profile_step --batch 1 --quantization none

It starts `batch` greedy requests (the throughput bench's questions), runs steps until every request is
decoding, times `--steps` pure decode steps (median), then profiles a few more with torch.profiler and
prints the top ops by self CPU time. Last line: one JSON object (also bench/results/profile_step.json).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template
from bench.report import emit
from bench.throughput import questions_for

DEFAULT_OUT = Path(__file__).parent / "results" / "profile_step.json"


def start_requests(engine: LLMEngine, batch: int, max_tokens: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, question in enumerate(questions_for(batch)):
        ids = apply_chat_template(engine.tokenizer, [{"role": "user", "content": question}])
        engine.add_request(f"r{i}", ids, params)


def warm_up(engine: LLMEngine) -> None:
    """Step until every request is past its prefill (then each step is one decode per request)."""
    while any(seq.num_output_tokens < 2 for seqs in engine.requests.values() for seq in seqs):
        engine.step()


def time_steps(engine: LLMEngine, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def profile_steps(engine: LLMEngine, steps: int, top: int) -> list[dict[str, Any]]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1
    return [
        {"op": e.key, "calls": e.count // steps, "ms_per_step": round(e.self_cpu_time_total / 1e3 / steps, 2),
         "share": round(e.self_cpu_time_total / total, 3)}
        for e in events[:top]
    ]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.profile_step", description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--quantization", default="auto", choices=["auto", "awq", "none"])
    p.add_argument("--steps", type=int, default=20, help="timed decode steps (median reported)")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    config = EngineConfig(quantization=args.quantization, num_threads=args.threads, enable_prefix_caching=False)
    engine = LLMEngine(config)
    start_requests(engine, args.batch, max_tokens=args.steps + args.profile_steps + 16)
    warm_up(engine)
    times = time_steps(engine, args.steps)
    ops = profile_steps(engine, args.profile_steps, args.top)
    for row in ops:
        print(f"{row['op']:<48} {row['calls']:>5} calls  {row['ms_per_step']:>8.2f} ms/step  {row['share']:>6.1%}")
    result = {"bench": "profile_step", "batch": args.batch, "quantization": args.quantization,
              "threads": torch.get_num_threads(), "step_ms_p50": round(statistics.median(times), 2),
              "tok_s": round(args.batch * 1e3 / statistics.median(times), 1), "top_ops": ops}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
