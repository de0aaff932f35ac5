"""The shipped GGUF's Q4_1 blocks served directly vs AWQ INT4 of their dequantized values vs round-to-nearest INT4 vs
fp32: perplexity on held-out text, weight bytes, decode speed.

    python -m bench.awq [--new-tokens 64] [--streams 1,32] [--rounds 2] [--window 512]

Perplexity runs through the engine itself (prompt log-probabilities, exactly what is served: INT4
projections and the low-bit lm_head copy) on backend/quant/data/heldout.txt, which the quantizer never
sees, in non-overlapping windows. fp32 is the full-precision copy (the GGUF dequantized: the reference all the INT4
copies approximate); gguf_q4_1 is `quantization: auto`'s copy, the file's own blocks (group 32); the RTN checkpoint
(no calibration) and the AWQ one (`quantization: awq`) are quantized again from fp32 with the same group size as
each other, made on first use under the cache folder.

Decode speed: per level, N streams each generate --new-tokens tokens (greedy, ignore_eos) from chat
prompts; the clock starts once every stream has its first token (prefill done), so it measures decode
steps only. fp32, AWQ INT4 and GGUF-block engines are measured back to back, --rounds times; the speedups
reported (AWQ over fp32, GGUF blocks over AWQ) are the medians of the per-round ratios (the machine is shared:
compare ratios, not absolute numbers). On a busy 2-core machine use --threads 1: with 2 threads every op waits
for a descheduled thread. The last line printed is one JSON object; it is also written to bench/results/awq.json.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from backend.config import EngineConfig, cache_dir, default_awq_model_path, default_gguf_model_path, default_model_path
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.quant.calibration import HELDOUT, token_ids
from backend.quant.convert import int4_weight_bytes
from backend.quant.int4_linear import Int4Linear
from backend.quant.lm_head import LowBitHead
from bench.report import default_out, emit

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "Explain gravity in one sentence.",
    "List three fruits.", "Why is the sky blue?", "How do plants make their food?",
    "Give me a tip for learning to code.", "What is photosynthesis?",
]


def rtn_model_path() -> Path:
    return cache_dir() / "models" / "rtn" / default_model_path().name


def ensure_checkpoints(fp_dir: Path, awq_dir: Path, rtn_dir: Path, gguf_dir: Path) -> None:
    from backend.fetch import fetch_gguf_blocks
    from backend.quant.awq import quantize_model

    fetch_gguf_blocks(gguf_dir)

    if not (awq_dir / "model.safetensors").exists():
        quantize_model(fp_dir, awq_dir)
    if not (rtn_dir / "model.safetensors").exists():
        quantize_model(fp_dir, rtn_dir, method="rtn")


def engine_for(model_dir: Path, threads: int = 0) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), enable_prefix_caching=False, num_threads=threads))


# ---- quality -----------------------------------------------------------------------------------
def perplexity(engine: LLMEngine, ids: list[int], window: int, prefix: tuple[int, ...] = (),
               *, max_windows: int | None = None) -> tuple[float, int]:
    """exp(mean negative log-likelihood) over non-overlapping windows (each window's first token unscored); `prefix`
    (a model's <bos>) starts every window unscored; `max_windows`: the first ones only."""
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    windows = [ids[i : i + window] for i in range(0, len(ids) - 1, window) if len(ids[i : i + window]) > 1]
    for n, w in enumerate(windows[:max_windows]):
        engine.add_request(f"ppl-{n}", [*prefix, *w], params)
    nll, count = 0.0, 0
    while engine.has_work:
        for out in engine.step():
            if out.prompt_logprobs is not None:
                lps = [t.logprob for t in out.prompt_logprobs[len(prefix) + 1 :] if t is not None]
                nll -= sum(lps)
                count += len(lps)
    return math.exp(nll / count), count


def weight_report(engine: LLMEngine) -> dict[str, int]:
    """Bytes of the projection weights (and the lm_head copy) as the engine holds them."""
    model = engine.runner.model
    proj = [m for layer in model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear | Int4Linear)]
    params = sum(m.in_features * m.out_features for m in proj)
    head = model.lm_head
    head_bytes = head.weight_bytes() if isinstance(head, LowBitHead) else {}
    return {
        "projection_params": params,
        "projection_fp16_bytes": params * 2,
        "projection_fp32_bytes": params * 4,
        "projection_int4_bytes": int4_weight_bytes(model),
        "lm_head_fp16_bytes": head.in_features * head.out_features * 2,
        "lm_head_int8_bytes": head_bytes.get("int8", 0),
        "lm_head_dense_bytes": head_bytes.get("dense", 0),
    }


# ---- speed -------------------------------------------------------------------------------------
def chat_prompt(engine: LLMEngine, question: str) -> list[int]:
    from backend.model.tokenizer import apply_chat_template

    return apply_chat_template(engine.tokenizer, [{"role": "user", "content": question}])


def decode_tok_s(engine: LLMEngine, streams: int, new_tokens: int) -> float:
    """Generated tokens per second over the steps after every stream got its first token."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for i in range(streams):
        engine.add_request(f"d{streams}-{i}-{time.monotonic_ns()}", chat_prompt(engine, QUESTIONS[i % len(QUESTIONS)]), params)
    started: set[str] = set()
    while len(started) < streams:  # prefill (chunked) until each stream has emitted a token
        started.update(o.request_id for o in engine.step() if any(d.token_ids for d in o.deltas))
    tokens, start = 0, time.perf_counter()
    while engine.has_work:
        tokens += sum(len(d.token_ids) for o in engine.step() for d in o.deltas)
    return tokens / (time.perf_counter() - start)


def speed(engines: dict[str, LLMEngine], levels: list[int], new_tokens: int, rounds: int
          ) -> tuple[dict[str, dict[int, float]], dict[int, list[float]], dict[int, list[float]]]:
    """Best tok/s per engine and level, and per round (back-to-back measurements) the int4 (AWQ) / fp32 and the
    GGUF blocks / AWQ ratios."""
    best: dict[str, dict[int, float]] = {name: {} for name in engines}
    ratios: dict[int, list[float]] = {s: [] for s in levels}
    gguf_ratios: dict[int, list[float]] = {s: [] for s in levels}
    for _ in range(rounds):
        for streams in levels:
            now: dict[str, float] = {}
            for name, engine in engines.items():  # alternate, so load changes hit both alike
                now[name] = decode_tok_s(engine, streams, new_tokens)
                best[name][streams] = max(best[name].get(streams, 0.0), now[name])
                print(f"decode {name:9s} streams={streams:<3d} {now[name]:8.1f} tok/s", flush=True)
            ratios[streams].append(now["int4"] / now["fp32"])
            gguf_ratios[streams].append(now["gguf_q4_1"] / now["int4"])
    return best, ratios, gguf_ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fp-dir", type=Path, default=default_model_path())
    parser.add_argument("--awq-dir", type=Path, default=default_awq_model_path())
    parser.add_argument("--rtn-dir", type=Path, default=rtn_model_path())
    parser.add_argument("--gguf-dir", type=Path, default=default_gguf_model_path())
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)
    ensure_checkpoints(args.fp_dir, args.awq_dir, args.rtn_dir, args.gguf_dir)
    engines = {"fp32": engine_for(args.fp_dir, args.threads), "int4": engine_for(args.awq_dir, args.threads)}
    ids = token_ids(engines["fp32"].tokenizer, HELDOUT)
    ppl: dict[str, float] = {}
    for name, engine in [("fp32", engines["fp32"]), ("rtn", None), ("gguf_q4_1", None), ("awq", engines["int4"])]:
        if name == "gguf_q4_1":
            engine = engines["gguf_q4_1"] = engine_for(args.gguf_dir, args.threads)  # raced in speed() too
        engine = engine or engine_for(args.rtn_dir, args.threads)
        ppl[name], scored = perplexity(engine, ids, args.window)
        print(f"perplexity {name:9s} {ppl[name]:8.3f}  ({scored} held-out tokens)", flush=True)
        del engine
    gguf_int4_bytes = int4_weight_bytes(engines["gguf_q4_1"].runner.model)
    weights = weight_report(engines["int4"])
    for key, value in weights.items():
        print(f"weights {key:24s} {value:>12,d}")
    levels = [int(s) for s in args.streams.split(",")]
    tok_s, ratios, gguf_ratios = speed(engines, levels, args.new_tokens, args.rounds)
    result = {
        "bench": "awq", "cpus": torch.get_num_threads(), "window": args.window, "heldout_tokens": scored,
        "group_size": engines["int4"].runner.model.layers[0].mlp.down_proj.group_size,
        "perplexity": {k: round(v, 3) for k, v in ppl.items()},
        "awq_over_fp32": round(ppl["awq"] / ppl["fp32"], 4), "rtn_over_fp32": round(ppl["rtn"] / ppl["fp32"], 4),
        "awq_beats_rtn": ppl["awq"] < ppl["rtn"],
        "gguf_q4_1_over_fp32": round(ppl["gguf_q4_1"] / ppl["fp32"], 4), "gguf_q4_1_beats_awq": ppl["gguf_q4_1"] < ppl["awq"],
        "weights": weights, "gguf_q4_1_projection_int4_bytes": gguf_int4_bytes,
        "projection_int4_over_fp16": round(weights["projection_int4_bytes"] / weights["projection_fp16_bytes"], 4),
        "decode_tok_s": {name: {str(k): round(v, 1) for k, v in levels_.items()} for name, levels_ in tok_s.items()},
        "int4_over_fp32": {str(s): round(statistics.median(ratios[s]), 3) for s in levels},  # median of rounds
        "int4_over_fp32_rounds": {str(s): [round(r, 3) for r in ratios[s]] for s in levels},
        "gguf_q4_1_over_awq": {str(s): round(statistics.median(gguf_ratios[s]), 3) for s in levels},
        "gguf_q4_1_over_awq_rounds": {str(s): [round(r, 3) for r in gguf_ratios[s]] for s in levels},
        "new_tokens": args.new_tokens, "rounds": args.rounds,
    }
    emit(result, default_out("awq"))  # bench/plots.py plots it


if __name__ == "__main__":
    main()
