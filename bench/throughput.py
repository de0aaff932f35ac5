"""Generation throughput and latency: this engine at 1 and 32 concurrent streams vs HF `generate`.

    python -m bench.throughput [--streams 1,32] [--new-tokens 128] [--hf-requests 3] [--dtype float32]
                               [--quantization auto|awq|none] [--threads N]
    python -m bench.throughput --quick        # a tiny run (4 prompts, 8 new tokens, 1 HF request)
    python -m bench.throughput --llama-server PATH   # llama.cpp's server measured in the same run (bench/peer.py)

Every request is a chat prompt from QUESTIONS (built with the model's chat template) that generates
exactly --new-tokens tokens (greedy, ignore_eos). The engine runs its serving configuration (SMOLGATE_*
variables apply; by default the INT4 copy of the default model, the GGUF's own blocks). Per concurrency level a fresh
engine is loaded, warmed up with one request, then `max(streams, --min-requests)` requests run with at
most `streams` in flight. Per request it records TTFT (submit -> first token) and inter-token latencies
(the gap between successive deltas, divided evenly when a delta carries several tokens). The baseline
is HF transformers `generate` on the full-precision weights, one request at a time (absent where
transformers is not installed, or with --no-hf). With --llama-server (or --peer-url) the peer serves the
same token ids at each concurrency level in the same run; without, it is reported as absent. The CPU
column is the cores this process kept busy (process time / wall): well below --threads means other load.
The last line printed is one JSON object with every figure and its provenance (bench/provenance.py); it
is also written to bench/results/throughput.json.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from backend.config import EngineConfig, engine_config_from_env
from backend.engine.async_engine import AsyncEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template, load_tokenizer, set_chat_template
from backend.model.weights import resolve_model_dir
from bench import peer
from bench.report import emit

DEFAULT_OUT = Path(__file__).parent / "results" / "throughput.json"
QUICK_PROMPTS = 4
WARMUP_QUESTION = "Say hello."
WARMUP_TOKENS = 2  # one prefill and one decode step: enough to warm the kernels, cheap in --quick

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain how a rainbow forms.",
    "Give me three tips for a good night's sleep.",
    "What is the difference between a virus and a bacterium?",
    "Write a short story opening about a lighthouse keeper.",
    "How does a bicycle stay upright?",
    "Summarise the water cycle for a ten-year-old.",
    "What are the main causes of inflation?",
    "Translate 'Where is the train station?' into French and German.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
    "Suggest a vegetarian dinner recipe.",
    "What were the main achievements of the Roman Empire?",
    "Explain recursion with an example.",
    "What should I pack for a weekend hiking trip?",
    "Describe the taste of a lemon to someone who has never had one.",
    "How do vaccines train the immune system?",
    "Write a limerick about a cat who loves coffee.",
    "What is the Pythagorean theorem and where is it used?",
    "Compare renewable and fossil energy sources.",
    "How can I improve my public speaking?",
    "Explain what an API is to a non-programmer.",
    "What is the tallest mountain on Earth, and how tall is it?",
    "Write a polite email declining a meeting invitation.",
    "How do plants make their food?",
    "What are black holes?",
    "Give me a weekly plan to start running.",
    "Why do we have seasons?",
    "Explain the rules of chess in a few sentences.",
    "What is machine learning?",
    "Write a motivational quote and explain it.",
]


# ---- measurements ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RequestTiming:
    ttft_s: float
    itls_s: list[float]
    wall_s: float
    new_tokens: int


@dataclass(frozen=True)
class LevelResult:
    streams: int
    timings: list[RequestTiming]
    wall_s: float
    cpu_s: float  # this process's CPU time over the level (all threads)
    preemptions: int

    @property
    def tokens(self) -> int:
        return sum(t.new_tokens for t in self.timings)

    def summary(self) -> dict[str, Any]:
        ttfts = [t.ttft_s for t in self.timings]
        itls = [x for t in self.timings for x in t.itls_s]
        return {
            "streams": self.streams,
            "requests": len(self.timings),
            "tokens": self.tokens,
            "wall_s": round(self.wall_s, 3),
            "tok_s": round(self.tokens / self.wall_s, 2),
            "cpu_cores_used": round(self.cpu_s / self.wall_s, 2),
            "ttft_p50_ms": _ms(ttfts, 50),
            "ttft_p99_ms": _ms(ttfts, 99),
            "itl_p50_ms": _ms(itls, 50),
            "itl_p99_ms": _ms(itls, 99),
            "preemptions": self.preemptions,
        }


def peer_summary(streams: int, timings: list[peer.PeerTiming], wall_s: float) -> dict[str, Any]:
    """The peer's figures in the engine's columns (its CPU use is another process's: not known here)."""
    level = LevelResult(streams, [RequestTiming(t.ttft_s, t.itls_s, t.wall_s, t.new_tokens) for t in timings], wall_s, 0.0, 0)
    return {**level.summary(), "cpu_cores_used": None, "preemptions": None}


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b > 0 else float("nan")


# ---- prompts -----------------------------------------------------------------------------------
def questions_for(count: int) -> list[str]:
    """`count` prompts from the fixed set, cycling if more are needed."""
    return [QUESTIONS[i % len(QUESTIONS)] for i in range(count)]


def chat(engine: AsyncEngine, question: str) -> list[int]:
    return engine.apply_chat_template([{"role": "user", "content": question}])


# ---- this engine -------------------------------------------------------------------------------
def greedy_params(new_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)


async def time_request(
    engine: AsyncEngine, prompt: list[int], params: SamplingParams, request_id: str
) -> RequestTiming:
    start = last = time.perf_counter()
    ttft: float | None = None
    itls: list[float] = []
    tokens = 0
    async for out in engine.generate(prompt, params, request_id):
        n = sum(len(d.token_ids) for d in out.deltas)
        if n == 0:
            continue
        now = time.perf_counter()
        if ttft is None:
            ttft = now - start  # tokens beyond the first in this delta have no gap of their own
        else:
            itls.extend([(now - last) / n] * n)
        last = now
        tokens += n
    if ttft is None or tokens != params.max_tokens:
        raise RuntimeError(f"{request_id}: expected {params.max_tokens} new tokens, got {tokens}")
    return RequestTiming(ttft, itls, last - start, tokens)


async def run_level(
    engine: AsyncEngine, prompts: list[list[int]], streams: int, new_tokens: int
) -> LevelResult:
    """All prompts with at most `streams` requests in flight; wall time from first submit to last token."""
    params = greedy_params(new_tokens)
    gate = asyncio.Semaphore(streams)

    async def one(i: int, prompt: list[int]) -> RequestTiming:
        async with gate:
            return await time_request(engine, prompt, params, f"bench-{streams}-{i}")

    preempted = engine.stats().num_preemptions
    start, cpu_start = time.perf_counter(), time.process_time()
    timings = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return LevelResult(streams, list(timings), wall, cpu, engine.stats().num_preemptions - preempted)


async def bench_engine(config: EngineConfig, streams: int, requests: int, new_tokens: int) -> LevelResult:
    """A fresh engine (so earlier levels leave no prompts in the prefix cache), warmed up, then timed."""
    engine = AsyncEngine.from_config(config)
    await engine.start()
    try:
        await time_request(engine, chat(engine, WARMUP_QUESTION), greedy_params(WARMUP_TOKENS), f"warmup-{streams}")
        prompts = [chat(engine, q) for q in questions_for(requests)]
        return await run_level(engine, prompts, streams, new_tokens)
    finally:
        await engine.shutdown()
        del engine
        gc.collect()


# ---- HF transformers baseline ------------------------------------------------------------------
@torch.inference_mode()
def bench_hf(
    model_dir: Path, dtype: str, device: str, questions: list[str], *, new_tokens: int
) -> dict[str, Any]:
    """HF `generate`, greedy, exactly `new_tokens` per request, one request at a time."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_flush_denormal(True)  # as the engine does: a fair comparison
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()

    def generate(question: str, n: int) -> int:
        messages = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        ids = {k: v.to(device) for k, v in ids.items()}
        out = model.generate(
            **ids, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=tokenizer.eos_token_id
        )
        return out.shape[1] - ids["input_ids"].shape[1]

    generate(WARMUP_QUESTION, WARMUP_TOKENS)
    start, cpu_start = time.perf_counter(), time.process_time()
    tokens = sum(generate(q, new_tokens) for q in questions)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "requests": len(questions),
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2),
        "cpu_cores_used": round(cpu / wall, 2),
    }


def hf_or_absent(
    model_dir: Path, dtype: str, device: str, questions: list[str], *, new_tokens: int
) -> dict[str, Any] | None:
    """The HF baseline, or None (reported as absent) where transformers is not installed."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    return bench_hf(model_dir, dtype, device, questions, new_tokens=new_tokens)


def hf_version() -> str:
    import transformers

    return str(transformers.__version__)


# ---- report ------------------------------------------------------------------------------------
def ratios(
    levels: list[LevelResult], hf_tok_s: float | None, peer_levels: dict[int, dict[str, Any]]
) -> dict[str, float]:
    out: dict[str, float] = {}
    for level in levels:
        tok_s = level.tokens / level.wall_s
        if hf_tok_s is not None:
            out[f"ratio_{level.streams}_vs_hf"] = _ratio(tok_s, hf_tok_s)
        if level.streams in peer_levels:
            out[f"ratio_{level.streams}_vs_peer"] = _ratio(tok_s, peer_levels[level.streams]["tok_s"])
    return out


def measure_peer(args: argparse.Namespace, model_dir: Path, threads: int, chat_template: str = "") -> dict[int, dict[str, Any]]:
    """The peer at every level of this run, on the same prompts (token ids) as the engine (the template the engine was
    configured with, where the model has none of its own: a base model such as Gemma 3 270M)."""
    tokenizer = load_tokenizer(model_dir)
    if chat_template:
        set_chat_template(tokenizer, chat_template)
    out: dict[int, dict[str, Any]] = {}
    with peer.peer_url_or_server(args, threads, max(args.streams), ctx_per_slot=1024) as url:
        for s in args.streams:
            prompts = [apply_chat_template(tokenizer, [{"role": "user", "content": q}])
                       for q in questions_for(max(s, args.min_requests))]
            timings, wall = asyncio.run(peer.run_level(url, prompts, s, args.new_tokens, api_key=args.peer_api_key))
            out[s] = peer_summary(s, timings, wall)
    return out


COLUMNS = (  # (header, JSON key, width, format of a float)
    ("reqs", "requests", 5, ""),
    ("tokens", "tokens", 8, ""),
    ("wall s", "wall_s", 8, ".1f"),
    ("tok/s", "tok_s", 8, ".1f"),
    ("TTFT p50", "ttft_p50_ms", 10, ".1f"),
    ("TTFT p99", "ttft_p99_ms", 10, ".1f"),
    ("ITL p50", "itl_p50_ms", 9, ".1f"),
    ("ITL p99", "itl_p99_ms", 9, ".1f"),
    ("CPU", "cpu_cores_used", 6, ".2f"),
)


def _row(name: str, figures: dict[str, Any]) -> str:
    cells = "".join(
        ("-" if figures.get(key) is None else format(figures[key], fmt)).rjust(width)
        for _, key, width, fmt in COLUMNS
    )
    return f"{name:<22}{cells}" + (f"  preemptions {figures['preemptions']}" if figures.get("preemptions") else "")


def format_table(result: dict[str, Any], streams: list[int]) -> str:
    lines = [
        f"throughput: {result['model']} {result['dtype']} (engine weights: {result['engine_quantization']}) "
        f"on {result['device']} "
        f"({result['threads']} threads), {result['new_tokens']} new tokens per request, greedy, ignore_eos",
        f"{'run':<22}" + "".join(h.rjust(w) for h, _, w, _ in COLUMNS) + "   (latencies in ms)",
        *(_row(f"engine, {n} stream{'s' * (n > 1)}", result[f"engine_{n}"]) for n in streams),
        *(_row(f"peer, {n} stream{'s' * (n > 1)}", result[f"peer_{n}"]) for n in streams if f"peer_{n}" in result),
        *([_row("HF generate, 1 by 1", result["hf_sequential"])] if "hf_sequential" in result else []),
        f"(CPU: cores this process kept busy, of {result['threads']}; well below that means other load)",
        "",
    ]
    for n in streams:
        if f"ratio_{n}_vs_hf" in result:
            lines.append(f"engine {n:>2} streams / HF sequential   x{result[f'ratio_{n}_vs_hf']:.2f}")
        if f"ratio_{n}_vs_peer" in result:
            lines.append(f"engine {n:>2} streams / peer            x{result[f'ratio_{n}_vs_peer']:.3f}")
    if result["hf"]["status"] == "absent":
        lines.append(f"HF generate: absent ({result['hf']['how']})")
    if result["peer"]["status"] == "absent":
        lines.append(f"peer: absent ({result['peer']['how']})")
    return "\n".join(lines)


# ---- main --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n")[0])
    p.add_argument("--streams", default="1,32", help="comma-separated concurrency levels (default 1,32)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per request (default 128)")
    p.add_argument("--hf-requests", type=int, default=3, help="HF generate requests, one by one (default 3)")
    p.add_argument("--min-requests", type=int, default=4, help="requests per level: max(streams, this)")
    p.add_argument(
        "--quantization",
        choices=["auto", "awq", "none"],
        help="the engine's copy of the default model: auto (the GGUF's INT4 blocks), awq (INT4, AWQ) or none (full "
        "precision, the weights HF runs); default: the engine's own default (SMOLGATE_QUANTIZATION, else auto)",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads for both engine and HF (0: all cores)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--model", default="", help="HF model dir or .gguf (default: the fetched SmolLM2)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON result")
    p.add_argument("--no-hf", action="store_true", help="skip the HF generate baseline (reported as absent)")
    p.add_argument("--quick", action="store_true", help="tiny run: 4 prompts, 8 new tokens, 1 HF request")
    peer.add_peer_args(p)
    args = p.parse_args(argv)
    args.streams = sorted({int(s) for s in args.streams.split(",") if s.strip()})
    if args.quick:
        args.streams = sorted({min(s, QUICK_PROMPTS) for s in args.streams})
        args.new_tokens, args.hf_requests, args.min_requests = 8, 1, 2
    if not args.streams or min(args.streams) < 1 or args.new_tokens < 1 or args.hf_requests < 1:
        p.error("--streams, --new-tokens and --hf-requests must be positive")
    return args


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The serving configuration (SMOLGATE_* variables apply) with this run's model, dtype and quantization."""
    base = engine_config_from_env(EngineConfig())
    config = replace(
        base,
        model=args.model or base.model,
        dtype=args.dtype,
        quantization=args.quantization or base.quantization,
        num_threads=args.threads or base.num_threads,
    )
    if not config.resolved_model().exists():
        raise SystemExit(
            f"{config.resolved_model()} is missing: run `python -m backend.fetch --copies {config.quantization}` "
            "or pass --quantization none"
        )
    return config


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    load_at_start = os.getloadavg()[0]  # the dev machine is shared: a busy start explains noisy figures
    config = engine_config(args)
    device = config.resolved_device()
    levels = [
        asyncio.run(bench_engine(config, s, max(s, args.min_requests), args.new_tokens)) for s in args.streams
    ]
    if config.num_threads:
        torch.set_num_threads(config.num_threads)  # the engine set it already; HF runs with the same
    model_dir = resolve_model_dir(replace(config, quantization="none").resolved_model())  # full precision
    hf = None if args.no_hf else hf_or_absent(model_dir, args.dtype, device, questions_for(args.hf_requests),
        new_tokens=args.new_tokens)
    peer_levels = measure_peer(args, model_dir, torch.get_num_threads(), config.chat_template) if peer.wanted(args) else {}
    result: dict[str, Any] = {
        "bench": "throughput",
        "model": model_dir.name,
        "dtype": args.dtype,
        "engine_quantization": "as in the checkpoint" if config.model else config.quantization,
        "device": device,
        "threads": torch.get_num_threads(),
        "new_tokens": args.new_tokens,
        "load_avg_1m_at_start": round(load_at_start, 2),
        **{f"engine_{lv.streams}": lv.summary() for lv in levels},
        "hf": {"status": "measured", "peer": "HF transformers generate", "version": hf_version()} if hf else
              {"status": "absent", "how": "install transformers (pip install -e '.[test]'); not --no-hf"},
        **({"hf_sequential": hf} if hf else {}),
        "peer": peer.describe(args) if peer.wanted(args) else peer.absent(),
        **{f"peer_{n}": figures for n, figures in peer_levels.items()},
        **ratios(levels, hf["tok_s"] if hf else None, peer_levels),
    }
    print(format_table(result, args.streams))
    return emit(result, args.out)


if __name__ == "__main__":
    main()
