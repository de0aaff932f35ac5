"""Prepacked oneDNN GEMM (backend/model/cpu_gemm.py) against F.linear and the int4 kernel, then in the engine.

    python -m bench.gemm [--threads 2] [--batches 1,32] [--steps 12]

1. micro: SmolLM2-135M's projection shapes at 1, 5 (a speculative verify) and 32 rows: fp32 and bf16
   F.linear vs the same weight prepacked, and torch's int4 kernel; best of 5 timings, microseconds.
2. engine: two full-precision engines side by side (`packed_copy` on / off), decode steps alternated
   between them, median step time per batch size; the ratio is what the packed copy buys.
Last line: one JSON object (also bench/results/gemm.json).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.model.cpu_gemm import PackedLinear
from bench.profile_step import start_requests, time_steps, warm_up
from bench.report import emit

OUT = Path(__file__).parent / "results" / "gemm.json"
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def best_us(fn: Callable[[], object], reps: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - start) / reps)
    return round(best * 1e6, 1)


def int4_call(w: torch.Tensor, rows: int) -> Callable[[], object]:
    """torch's CPU int4 kernel on a random 4-bit weight of w's shape (group 64): the INT4 decode path."""
    out_f, in_f = w.shape
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (out_f, in_f), dtype=torch.int32), 1)
    scales_zeros = torch.randn(in_f // 64, out_f, 2).bfloat16()
    x = torch.randn(rows, in_f).bfloat16()
    return lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 64, scales_zeros)


def shape_row(name: str, w32: torch.Tensor, rows: int) -> dict[str, Any]:
    w16 = w32.bfloat16()
    p32, p16 = PackedLinear(w32), PackedLinear(w16)
    x32 = torch.randn(rows, w32.shape[1])
    x16 = x32.bfloat16()
    reps = 10 if name == "lm_head" else 100
    calls = {
        "fp32_linear": lambda: F.linear(x32, w32), "fp32_packed": lambda: p32(x32),
        "bf16_linear": lambda: F.linear(x16, w16), "bf16_packed": lambda: p16(x16), "int4": int4_call(w32, rows),
    }
    return {"shape": name, "rows": rows, **{k: best_us(fn, reps) for k, fn in calls.items()}}


@torch.inference_mode()
def micro(rows_list: tuple[int, ...] = (1, 5, 32)) -> list[dict[str, Any]]:
    out = []
    for name, shape in SHAPES.items():
        w32 = torch.randn(*shape)
        for rows in rows_list:
            out.append(shape_row(name, w32, rows))
            print(out[-1], flush=True)
    return out


def engine_ab(batches: list[int], steps: int, threads: int) -> list[dict[str, Any]]:
    out = []
    for batch in batches:
        engines = {
            on: LLMEngine(EngineConfig(quantization="none", packed_copy=on, num_threads=threads, enable_prefix_caching=False))
            for on in (False, True)
        }
        for engine in engines.values():
            start_requests(engine, batch, max_tokens=steps * 3 + 16)
            warm_up(engine)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(steps):  # alternate so both see the same machine
            for on, engine in engines.items():
                times[on] += time_steps(engine, 3)
        plain, packed = statistics.median(times[False]), statistics.median(times[True])
        row = {"batch": batch, "plain_step_ms": round(plain, 2), "packed_step_ms": round(packed, 2),
               "speedup": round(plain / packed, 3)}  # fmt: skip
        print(row, flush=True)
        out.append(row)
        del engines
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.gemm", description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,32", help="engine A/B batch sizes (empty: skip)")
    p.add_argument("--steps", type=int, default=12, help="rounds of 3 decode steps per engine")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = {"bench": "gemm", "threads": args.threads, "micro": micro()}
    batches = [int(b) for b in args.batches.split(",") if b]
    result["engine"] = engine_ab(batches, args.steps, args.threads) if batches else []
    return emit(result, OUT)


if __name__ == "__main__":
    main()
