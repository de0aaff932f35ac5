"""The project's C kernels for x86 CPUs against torch's ops, side by side: two engines in one process.

    python -m bench.cpu_kernels                       # the serving configuration (AWQ INT4), 32 and 1 streams
    python -m bench.cpu_kernels --quantization none   # full precision: only the decode attention differs

Engine "torch": `int4_cpu_kernel=torch` (torch's int4 kernel + a dense fp32/bf16 copy for batches, the int8/dense
lm_head) and `kernel_backend=torch` (block gather + masked SDPA). Engine "c": the defaults on an x86 AVX2 CPU,
i.e. the W4A8 projections and W8A8 lm_head (kernels/cpu/w4a8.c, kernels/cpu/w8a8.c), the paged decode attention
(kernels/cpu/paged_decode.h), the fused norms/RoPE/SwiGLU (kernels/cpu/elementwise.c), for INT4 models a bf16 KV cache that
kernel reads and the decode stack (kernels/cpu/decode_layers.c: all layers of a decode step in one C call). Engine
"c-layers": the same kernels called layer by layer from Python (the decode stack off). Engine "c-avx2", on CPUs with
AVX-512 VNNI only: engine "c" with the AVX2 GEMMs forced (SMOLGATE_CPU_ISA=avx2 while it loads), so `isa_speedup` is
what the *_avx512.c GEMMs buy in the same run; each row names its GEMMs' instruction set. Reported per engine:
held-out perplexity (backend/quant/data/heldout.txt, 512-token windows), the weight bytes it holds, the KV
dtype, and the decode step time p50 at each batch size, the two engines stepping alternately on the same
requests (the throughput bench's questions) so they see the same contexts at the same moments of a noisy
machine; only the ratio means anything. Last line: one JSON object (also bench/results/cpu_kernels.json).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.quant.int4_linear import Int4Linear
from backend.quant.lm_head import LowBitHead
from bench.awq import perplexity
from bench.kv_dtype import alternate
from bench.profile_step import start_requests, warm_up
from bench.report import emit
from kernels.cpu.build import ISA_ENV, avx512_available, c_kernels_unavailable, cpu_isa

DEFAULT_OUT = Path(__file__).parent / "results" / "cpu_kernels.json"
HELDOUT = Path(__file__).parents[1] / "backend" / "quant" / "data" / "heldout.txt"
ENGINES = {"torch": {"int4_cpu_kernel": "torch", "kernel_backend": "torch"}, "c-layers": {}, "c": {}}
LAYER_BY_LAYER = {"c-layers"}  # engines whose decode stack is removed
FORCED_ISA = {"c-avx2": "avx2"}  # engines loaded with SMOLGATE_CPU_ISA set (only where the CPU has AVX-512 VNNI)


@contextlib.contextmanager
def isa(name: str | None) -> Iterator[None]:
    """SMOLGATE_CPU_ISA=name while an engine loads (its kernels are chosen then); None leaves it as it is."""
    before = os.environ.get(ISA_ENV)
    if name is not None:
        os.environ[ISA_ENV] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ISA_ENV, None)
        else:
            os.environ[ISA_ENV] = before


def engine_isa(name: str) -> str | None:
    """The instruction set of an engine's C GEMMs (None: it runs none)."""
    if name == "torch" or c_kernels_unavailable() is not None:
        return None
    with isa(FORCED_ISA.get(name)):
        return cpu_isa()


def weight_bytes(engine: LLMEngine) -> int:
    """Bytes of the projection and lm_head weights as served (all copies), or of every parameter if unquantized."""
    model = engine.runner.model
    int4 = [m for m in model.modules() if isinstance(m, Int4Linear)]
    if not int4:
        return sum(p.numel() * p.element_size() for p in model.parameters())
    head = model.lm_head
    head_bytes = sum(head.weight_bytes().values()) if isinstance(head, LowBitHead) else 0
    return sum(m.weight_bytes() + m.dense_copy_bytes() for m in int4) + head_bytes


def step_times(engines: dict[str, LLMEngine], batch: int, steps: int) -> dict[str, float]:
    for engine in engines.values():
        start_requests(engine, batch, max_tokens=steps + 16)
        warm_up(engine)
    times = alternate(engines, steps)
    for engine in engines.values():
        for request_id in list(engine.requests):
            engine.abort(request_id)
    return {name: round(statistics.median(t), 1) for name, t in times.items()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.cpu_kernels", description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="32,1")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--quantization", default="auto", choices=["auto", "awq", "none"])
    p.add_argument("--ppl-tokens", type=int, default=0, help="held-out tokens scored (0: all, ~4k; -1: skip)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    names = {**ENGINES, **({"c-avx2": {}} if avx512_available() and c_kernels_unavailable() is None else {})}
    engines = {}
    for name, overrides in names.items():
        with isa(FORCED_ISA.get(name)):
            engines[name] = LLMEngine(EngineConfig(quantization=args.quantization, enable_prefix_caching=False, **overrides))
    for name in LAYER_BY_LAYER:
        engines[name].runner.model.decode_stack = None
    rows: dict[str, dict[str, Any]] = {
        name: {"ops": e.runner.model.ops.name, "kv_dtype": str(e.runner.kv_cache.dtype).removeprefix("torch."),
               "weight_bytes": weight_bytes(e), "gemm_isa": engine_isa(name)}
        for name, e in engines.items()
    }
    if args.ppl_tokens >= 0:
        ids = engines["c"].tokenizer.encode(HELDOUT.read_text())
        ids = ids[: args.ppl_tokens] if args.ppl_tokens else ids
        for name, engine in engines.items():
            if name in LAYER_BY_LAYER:
                continue  # bit-identical logits to "c" (tests/test_decode_stack.py); prefill is the same path anyway
            # "c-avx2" is scored: its GEMMs sum in fp32 over 8 lanes, not 16 (the logits differ by rounding)
            rows[name]["perplexity"] = round(perplexity(engine, ids, 512)[0], 3)
    for batch in (int(b) for b in args.batches.split(",")):
        for name, ms in step_times(engines, batch, args.steps).items():
            rows[name][f"step_ms_b{batch}"] = ms
    for name, row in rows.items():
        print(f"{name:<6} " + "  ".join(f"{k} {v}" for k, v in row.items()))
    ratios = {k: round(rows["torch"][k] / rows["c"][k], 3) for k in rows["c"] if k.startswith("step_ms")}
    stack = {k: round(rows["c-layers"][k] / rows["c"][k], 3) for k in rows["c"] if k.startswith("step_ms")}
    wide = {k: round(rows["c-avx2"][k] / rows["c"][k], 3) for k in rows["c"] if k.startswith("step_ms")} if (
        "c-avx2" in rows) else {}
    for k, r in ratios.items():
        print(f"{k}: torch / c = x{r:.2f}, c-layers / c = x{stack[k]:.2f}"
              + (f", c-avx2 / c ({rows['c']['gemm_isa']}) = x{wide[k]:.2f}" if wide else ""))
    result = {"bench": "cpu_kernels", "quantization": args.quantization, "steps": args.steps,
              "threads": torch.get_num_threads(), "engines": rows, "speedup": ratios,
              "decode_stack_speedup": stack, "isa_speedup": wide}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
