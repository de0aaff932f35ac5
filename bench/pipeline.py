"""Pipeline parallelism: tokens/s and memory per rank, pp=2 (2 local gloo processes) against pp=1.

    python -m bench.pipeline [--prompts 16] [--new-tokens 32] [--quantization none|awq]

One fixed batch: `--prompts` chat questions from bench.throughput submitted at once, each generating exactly
`--new-tokens` tokens (greedy, ignore_eos), after a 2-token warm-up request. Runs, each a fresh engine:
pp=1 with 1 thread, pp=1 with 2 threads, pp=2 with 1 thread per rank (the same 2 cores in all). Per run:
aggregate tokens/s, and on rank 0 the bytes of its parameters and of its KV cache; stage 1's parameter bytes
come from loading that stage here. The last line printed is one JSON object, also written to
bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import functools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from backend.config import EngineConfig, engine_config_from_env
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template
from backend.model.weights import load_model, resolve_model_dir
from backend.parallel.local_group import run_ranks
from bench.report import emit
from bench.throughput import WARMUP_QUESTION, questions_for

DEFAULT_OUT = Path(__file__).parent / "results" / "pipeline.json"
MiB = 2**20


def _run(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds to run every prompt to `new_tokens` tokens, all submitted at once."""
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    for i, ids in enumerate(prompts):
        engine.add_request(f"b{i}", ids, params)
    start = time.perf_counter()
    while engine.has_work:
        engine.step()
    return time.perf_counter() - start


def measure(engine: LLMEngine, questions: list[str], new_tokens: int) -> dict[str, float]:
    """Rank 0's job: warm up, time the batch, report its memory (runs in the spawned rank 0 for pp=2)."""
    chat = [apply_chat_template(engine.tokenizer, [{"role": "user", "content": q}]) for q in questions]
    warm = apply_chat_template(engine.tokenizer, [{"role": "user", "content": WARMUP_QUESTION}])
    _run(engine, [warm], 2)
    wall = _run(engine, chat, new_tokens)
    model = engine.runner.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "tok_s": round(len(chat) * new_tokens / wall, 2),
        "wall_s": round(wall, 2),
        "rank0_param_mib": round(params / MiB, 1),
        "rank0_kv_cache_mib": round(engine.runner.kv_cache.numel() * engine.runner.kv_cache.element_size() / MiB, 1),
        "kv_layers": engine.runner.kv_cache.shape[0],
        "kv_blocks": engine.kv.pool.num_blocks,
    }


def stage_param_mib(config: EngineConfig, stage: int, stages: int) -> float:
    model = load_model(resolve_model_dir(config.resolved_model()), replace(config, device="cpu"), 64, pp=(stage, stages))
    return round(sum(p.numel() * p.element_size() for p in model.parameters()) / MiB, 1)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--quantization", default="none", choices=["none", "awq", "int8"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    base = replace(engine_config_from_env(EngineConfig()), quantization=args.quantization, kv_cache_memory_mb=256)
    job = functools.partial(measure, questions=questions_for(args.prompts), new_tokens=args.new_tokens)
    result: dict[str, Any] = {"bench": "pipeline", "quantization": args.quantization, "prompts": args.prompts,
                              "new_tokens": args.new_tokens, "threads_available": torch.get_num_threads()}
    for name, threads in (("pp1_1thread", 1), ("pp1_2threads", 2)):
        engine = LLMEngine(replace(base, num_threads=threads))
        result[name] = job(engine)
        del engine
        print(name, result[name], flush=True)
    result["pp2_1thread_each"] = run_ranks(2, replace(base, num_threads=1, pipeline_parallel_size=2), job)
    result["pp2_1thread_each"]["rank1_param_mib"] = stage_param_mib(base, 1, 2)
    print("pp2_1thread_each", result["pp2_1thread_each"], flush=True)
    return emit(result, args.out)


if __name__ == "__main__":
    main()
