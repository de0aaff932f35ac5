"""Prepacked oneDNN GEMM (backend/quant/cpu_gemm.py) against F.linear and the int4 kernel, then in the engine.

    python -m bench.gemm [--threads 2] [--batches 1,32] [--steps 12]
    python -m bench.gemm --only-c          # section 3 alone: the C GEMMs, AVX2 vs AVX-512 VNNI

1. micro: SmolLM2-135M's projection shapes at 1, 5 (a speculative verify) and 32 rows: fp32 and bf16
   F.linear vs the same weight prepacked, and torch's int4 kernel; best of 5 timings, microseconds.
2. engine: two full-precision engines side by side (`packed_copy` on / off), decode steps alternated
   between them, median step time per batch size; the ratio is what the packed copy buys.
3. c_kernels: the C GEMMs on every instruction set this CPU runs (AVX2; AVX-512 VNNI where it has it), side by side:
   the W4A8 projections (group 64) and the W8A8 lm_head at 1, 5 and 32 rows (best of 5, microseconds), and one decode
   token's weight stream (30 layers' distinct projections, then the lm_head, at one row: ms and GB/s, so the weights
   come from memory as in a one-stream decode step); `isa_speedup` is AVX2's time over AVX-512's. With --threads 1
   these are the thread's CPU time (`clock: thread_cpu`: a shared machine's other jobs do not count), else wall time.
   `layouts`: the same 30 layers' projections at 1 and 32 rows in each W4A8 weight layout, per instruction set (best
   of 7 / 3, ms): AWQ's group 64, group 32 split (fp32 scales and zero terms apart, a zero pass) and group 32 in the
   blocks layout the GGUF weights are served in (fp16 scales inline, kernels/cpu/w4a8_blocks.h).
Last line: one JSON object (also bench/results/gemm.json), the CPU's flags and the C kernels' choice in its
provenance (machine.cpu_flags, machine.kernel_isa).
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

from backend.config import EngineConfig, cache_dir
from backend.engine.llm_engine import LLMEngine
from backend.quant.cpu_gemm import PackedLinear
from bench.profile_step import start_requests, time_steps, warm_up
from bench.report import emit
from kernels.cpu.build import avx512_available, c_kernels_unavailable
from kernels.cpu.w4a8 import W4A8Weight, load_w4a8, pack_w4a8, pack_w4a8_blocks, pack_w4a8_terms, w4a8_linear
from kernels.cpu.w8a8 import W8A8Weight, load_w8a8, pack_w8a8, w8a8_linear

OUT = Path(__file__).parent / "results" / "gemm.json"
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "lm_head": (49152, 576)}


def best_us(fn: Callable[[], object], reps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(5):
        start = clock()
        for _ in range(reps):
            fn()
        best = min(best, (clock() - start) / reps)
    return round(best * 1e6, 1)


def c_clock() -> tuple[Callable[[], float], str]:
    """Section 3's clock: with one thread the thread's CPU time (time.thread_time), which a shared machine's other jobs
    inflate only through the caches and memory they share, not by taking the core away; wall time otherwise."""
    return (time.thread_time, "thread_cpu") if torch.get_num_threads() == 1 else (time.perf_counter, "wall")


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


def _int4(shape: tuple[int, int], g: torch.Generator) -> W4A8Weight:
    n, k = shape
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    return pack_w4a8(q, torch.rand(n, k // 64, generator=g) * 0.01, torch.randint(0, 16, (n, k // 64), generator=g).float())


@torch.inference_mode()
def c_kernels(rows_list: tuple[int, ...] = (1, 5, 32), layers: int = 30) -> dict[str, Any]:
    """The W4A8 and W8A8 C kernels per instruction set (section 3 of the module docstring)."""
    if c_kernels_unavailable() is not None:
        return {"status": "absent", "why": c_kernels_unavailable()}
    isas = ("avx2", "avx512") if avx512_available() else ("avx2",)
    folder = cache_dir() / "kernels"
    libs = {isa: (load_w4a8(folder, isa), load_w8a8(folder, isa)) for isa in isas}
    g = torch.Generator().manual_seed(0)
    int4 = {name: _int4(shape, g) for name, shape in SHAPES.items() if name != "lm_head"}
    head = pack_w8a8(torch.randn(*SHAPES["lm_head"], generator=g))

    def call(isa: str, name: str, x: torch.Tensor) -> Callable[[], object]:
        w4, w8 = libs[isa]
        return (lambda: w8a8_linear(w8, x, head)) if name == "lm_head" else (lambda: w4a8_linear(w4, x, int4[name]))

    micro_rows = []
    for name, (_, k) in SHAPES.items():
        for rows in rows_list:
            x = torch.randn(rows, k, generator=g)
            reps = 5 if name == "lm_head" else 50
            row = {"shape": name, "rows": rows, **{isa: best_us(call(isa, name, x), reps, c_clock()[0]) for isa in isas}}
            micro_rows.append(row)
            print(row, flush=True)
    stream = decode_stream(libs, [[_int4(shape, g) for name, shape in SHAPES.items() if name != "lm_head"]
                                  for _ in range(layers)], head)
    print(stream, flush=True)
    speedup = {"decode_stream": round(stream["avx2_ms"] / stream["avx512_ms"], 3)} if "avx512" in isas else {}
    return {"isas": list(isas), "clock": c_clock()[1], "micro": micro_rows, "decode_stream": stream, "isa_speedup": speedup,
            "layouts": layouts(libs)}


def decode_stream(libs: dict[str, tuple[Any, Any]], layers: list[list[W4A8Weight]], head: W8A8Weight) -> dict[str, Any]:
    """One token's GEMMs at one row over distinct weights (from memory, not cache), the ISAs taking turns; best of 15."""
    nbytes = sum(w.nbytes() for layer in layers for w in layer) + head.nbytes()
    xs = {k: torch.randn(1, k) for k in {w.shape[1] for w in layers[0]} | {head.q.shape[1]}}
    best = dict.fromkeys(libs, float("inf"))
    clock = c_clock()[0]
    for _ in range(15):
        for isa, (w4, w8) in libs.items():
            start = clock()
            for layer in layers:
                for w in layer:
                    w4a8_linear(w4, xs[w.shape[1]], w)
            w8a8_linear(w8, xs[head.q.shape[1]], head)
            best[isa] = min(best[isa], clock() - start)
    out: dict[str, Any] = {"layers": len(layers), "mb": round(nbytes / 1e6, 1)}
    for isa, t in best.items():
        out[f"{isa}_ms"], out[f"{isa}_gb_s"] = round(t * 1e3, 3), round(nbytes / t / 1e9, 1)
    return out


LAYOUTS = ("g64", "g32_split", "g32_blocks")


def _int4_layout(shape: tuple[int, int], layout: str, g: torch.Generator) -> W4A8Weight:
    """Random 4-bit weights with fp16-exact scales and zero terms, in one of LAYOUTS."""
    n, k = shape
    group = 64 if layout == "g64" else 32
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d, z = ((torch.rand(n, k // group, generator=g) * 0.01).half().float() for _ in range(2))
    return pack_w4a8_blocks(q, d, z) if layout == "g32_blocks" else pack_w4a8_terms(q, d, z)


def layouts(libs: dict[str, tuple[Any, Any]], rows_list: tuple[int, ...] = (1, 32), layers: int = 30) -> list[dict[str, Any]]:
    """30 layers' projections per weight layout, instruction set and row count, taking turns (best of 7 / 3, ms)."""
    g = torch.Generator().manual_seed(1)
    shapes = [shape for name, shape in SHAPES.items() if name != "lm_head"]
    weights = {lay: [[_int4_layout(s, lay, g) for s in shapes] for _ in range(layers)] for lay in LAYOUTS}
    clock, out = c_clock()[0], []
    for rows in rows_list:
        xs = {k: torch.randn(rows, k, generator=g) for _, k in shapes}
        best = {(isa, lay): float("inf") for isa in libs for lay in LAYOUTS}
        for _ in range(7 if rows == 1 else 3):
            for isa, (w4, _) in libs.items():
                for lay, stack in weights.items():
                    start = clock()
                    for layer in stack:
                        for w in layer:
                            w4a8_linear(w4, xs[w.shape[1]], w)
                    best[isa, lay] = min(best[isa, lay], clock() - start)
        row = {"rows": rows, **{f"{isa}_{lay}_ms": round(t * 1e3, 3) for (isa, lay), t in best.items()}}
        print(row, flush=True)
        out.append(row)
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
    p.add_argument("--only-c", action="store_true", help="only section 3, the C kernels per instruction set")
    p.add_argument("--out", type=Path, default=OUT, help="where to write the JSON result")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.only_c:
        return emit({"bench": "gemm", "threads": args.threads, "c_kernels": c_kernels()}, args.out)
    result = {"bench": "gemm", "threads": args.threads, "micro": micro()}
    batches = [int(b) for b in args.batches.split(",") if b]
    result["engine"] = engine_ab(batches, args.steps, args.threads) if batches else []
    result["c_kernels"] = c_kernels()
    return emit(result, args.out)


if __name__ == "__main__":
    main()
