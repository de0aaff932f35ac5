"""Prefill attention on the C kernels, side by side: every prefill token through the paged decode kernel (one decode
query per token, `per_token_prefill`: batch-invariant) against SDPA over the padded context for long chunks.

    python -m bench.prefill_attention                         # the serving configuration (AWQ)
    python -m bench.prefill_attention --quantization none --lengths 50,500,2000

One engine (prefix caching off, so every prompt is computed in full); for each prompt length, a fresh random
prompt timed from submission to its first token (chunked by `max_num_batched_tokens`, 512), with the runner's
`per_token` on and off in turn, `--reps` rounds. Reported per length: time to first token p50 of both and their
ratio. Then a consistency check: a greedy request run alone and again on a warm prefix cache, per mode (equal
log-probabilities or not). Then (`--kernel-tokens`, 0 skips it) the two entries of the C attention kernel on their own,
one layer of the served model's attention shape over a bf16 cache: a prompt of that many tokens in chunks of
`max_num_batched_tokens`, every token through the tiled prefill entry (`paged_prefill_cpu`, what per_token runs) and
token by token through the decode entry (`paged_decode_cpu`, what it ran before), interleaved, best of `--reps`, wall
and the process's CPU time (less disturbed than wall time by a shared machine's other jobs), and whether the two
outputs are equal to the bit. Last line: one JSON object (also bench/results/prefill_attention.json).
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

import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from bench.report import emit
from kernels.cpu.paged_decode import paged_decode_cpu, paged_prefill_cpu

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


def kernel_entries(engine: LLMEngine, tokens: int, chunk: int, reps: int) -> dict[str, Any]:
    """One layer's prefill attention of `tokens` tokens in `chunk`-token chunks, through the tiled prefill entry and
    token by token through the decode entry of the C kernel (the engine's lib and its model's head shape)."""
    lib, c = engine.runner.model.ops.decode_kernel, engine.runner.model.config
    heads, kv_heads, head_dim, bs = c.num_attention_heads, c.num_key_value_heads, engine.runner.model.head_dim, 16
    blocks = -(-tokens // bs)
    g = torch.Generator().manual_seed(0)
    cache = torch.randn(2, blocks * bs, kv_heads, head_dim, generator=g).to(torch.bfloat16)
    table = torch.randperm(blocks, generator=g).int()[None]
    starts = list(range(0, tokens, chunk))
    queries = [torch.randn(min(chunk, tokens - s), heads, head_dim, generator=g) for s in starts]

    def tiled(q: torch.Tensor, done: int) -> torch.Tensor:
        n = q.shape[0]
        cu, lens = torch.tensor([0, n], dtype=torch.int32), torch.tensor([done + n], dtype=torch.int32)
        return paged_prefill_cpu(lib, q, cache, table, cu_seqlens_q=cu, context_lens=lens, block_size=bs, scale=head_dim**-0.5,
            max_len=done + n)

    def token_by_token(q: torch.Tensor, done: int) -> torch.Tensor:
        n = q.shape[0]
        lens = torch.arange(done + 1, done + n + 1, dtype=torch.int32)
        return paged_decode_cpu(lib, q, cache, table.repeat(n, 1), context_lens=lens, block_size=bs, scale=head_dim**-0.5,
            window=0, max_len=done + n)

    best = {name: (float("inf"), float("inf")) for name in ("tiled", "token_by_token")}
    outs: dict[str, list[torch.Tensor]] = {}
    for _ in range(reps):
        for name, fn in (("token_by_token", token_by_token), ("tiled", tiled)):
            wall, cpu = time.perf_counter(), time.process_time()
            outs[name] = [fn(q, s) for q, s in zip(queries, starts, strict=True)]
            wall, cpu = (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    equal = all(torch.equal(a, b) for a, b in zip(outs["tiled"], outs["token_by_token"], strict=True))
    row = {f"{name}_{k}_ms": round(v, 1) for name, (w, t) in best.items() for k, v in (("wall", w), ("cpu", t))}
    return {"tokens": tokens, "chunk": chunk, "threads": torch.get_num_threads(), **row, "equal_to_the_bit": equal,
            "tiled_over_token_by_token_wall": round(best["tiled"][0] / best["token_by_token"][0], 3)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.prefill_attention", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="50,200,500,1000,2000", help="prompt lengths in tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quantization", default="auto", choices=["auto", "awq", "none"])
    p.add_argument("--kernel-tokens", type=int, default=2000, help="the C kernel's two entries on one layer (0: skip)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    config = EngineConfig(quantization=args.quantization, max_model_len=max(*lengths, args.kernel_tokens) + 64,
                          kv_cache_memory_mb=512)
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
    if args.kernel_tokens > 0:
        kernel = kernel_entries(engine, args.kernel_tokens, config.max_num_batched_tokens, args.reps)
        print(f"one layer, {kernel['tokens']} tokens in chunks of {kernel['chunk']}: tiled prefill entry "
              f"{kernel['tiled_wall_ms']} ms ({kernel['tiled_cpu_ms']} ms CPU), token by token "
              f"{kernel['token_by_token_wall_ms']} ms ({kernel['token_by_token_cpu_ms']}), "
              f"x{kernel['tiled_over_token_by_token_wall']}; equal to the bit: {kernel['equal_to_the_bit']}")
        result["kernel"] = kernel
    return emit(result, args.out)


if __name__ == "__main__":
    main()
