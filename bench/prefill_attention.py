"""Prefill attention on the C kernels, side by side: every prefill token through the paged decode kernel (one decode
query per token, `per_token_prefill`: batch-invariant) against SDPA over the padded context for long chunks.

    python -m bench.prefill_attention                         # the serving configuration (AWQ)
    python -m bench.prefill_attention --quantization none --lengths 50,500,2000

One engine (prefix caching off, so every prompt is computed in full); for each prompt length, a fresh random
prompt timed from submission to its first token (chunked by `max_num_batched_tokens`, 512), with the runner's
`per_token` on and off in turn, `--reps` rounds. Reported per length: time to first token p50 of both and their
ratio. Then a consistency check: a greedy request run alone and again on a warm prefix cache, per mode (equal
log-probabilities or not). Last line: one JSON object (also bench/results/prefill_attention.json).
In process, no HTTP: `python -m bench.prefill` times the first token through the server, next to llama.cpp's.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from pathlib import Path
from typing import Any

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from bench.report import emit

DEFAULT_OUT = Path(__file__).parent / "results" / "prefill_attention.json"
MODES = {"per_token": True, "sdpa": False}


def time_to_first_token(engine: LLMEngine, prompt: list[int]) -> float:
    """Milliseconds from submission to the first generated token (the engine otherwise idle)."""
    engine.add_request(f"p{random.random()}", prompt, SamplingParams(max_tokens=1, temperature=0))
    start = time.perf_counter()
    while engine.has_work:
        engine.step()
    return (time.perf_counter() - start) * 1e3


def sweep(engine: LLMEngine, lengths: list[int], reps: int, rng: random.Random) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {str(n): {m: [] for m in MODES} for n in lengths}
    for _ in range(reps):
        for n in lengths:
            for mode, per_token in MODES.items():  # interleaved: both see the same phase of a noisy machine
                engine.runner.per_token = per_token
                times[str(n)][mode].append(time_to_first_token(engine, [rng.randrange(1000, 30000) for _ in range(n)]))
    return times


def repeat_agrees(model_config: EngineConfig, per_token: bool, prompt: list[int]) -> bool:
    """A greedy request alone, then again over its own prefix-cached blocks: the same log-probabilities?"""
    engine = LLMEngine(model_config)
    engine.runner.per_token = per_token
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=2)
    runs = []
    for rid in ("first", "again"):
        engine.add_request(rid, prompt, params)
        deltas = []
        while engine.has_work:
            deltas += [d for out in engine.step() for d in out.deltas]
        runs.append([(d.token_ids, d.logprobs) for d in deltas])
    return runs[0] == runs[1]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.prefill_attention", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="50,200,500,1000,2000", help="prompt lengths in tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quantization", default="auto", choices=["auto", "awq", "none"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    config = EngineConfig(quantization=args.quantization, max_model_len=max(lengths) + 64, kv_cache_memory_mb=512)
    engine = LLMEngine(dataclasses.replace(config, enable_prefix_caching=False))
    if not engine.runner.per_token:
        raise SystemExit("the C paged decode kernel does not serve this model here: nothing to compare")
    rng = random.Random(0)
    time_to_first_token(engine, [rng.randrange(1000, 30000) for _ in range(64)])  # warm-up
    rows = {}
    for n, t in sweep(engine, lengths, args.reps, rng).items():
        a, b = statistics.median(t["per_token"]), statistics.median(t["sdpa"])
        rows[n] = {"per_token_ms": round(a, 1), "sdpa_ms": round(b, 1), "per_token_over_sdpa": round(a / b, 3)}
        print(f"prompt {n:>5} tokens  per-token {a:8.1f} ms  sdpa {b:8.1f} ms  ratio {a / b:.3f}")
    prompt = [rng.randrange(1000, 30000) for _ in range(min(max(lengths), 200))]
    agrees = {mode: repeat_agrees(config, per_token, prompt) for mode, per_token in MODES.items()}
    print(f"a request again over its cached prefix computes the same log-probabilities: {agrees}")
    result = {"bench": "prefill_attention", "quantization": args.quantization, "reps": args.reps, "ttft": rows,
              "repeat_equal_logprobs": agrees}
    return emit(result, args.out)


if __name__ == "__main__":
    main()
