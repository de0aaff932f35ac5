"""What determinism costs: the serving configuration with `deterministic` on (the default) and off, side by side.

    python -m bench.determinism                      # the default model's INT4 copy (SMOLGATE_* variables apply)
    python -m bench.determinism --model DIR --streams 1,16 --new-tokens 32 --rounds 2

Two engines in one process, identical but for EngineConfig.deterministic (docs/determinism.md). Per concurrency level
they run the same greedy chat requests (bench.throughput's questions, --new-tokens tokens each, every prompt prefilled
from scratch: prefix caching off), alternately, --rounds times, so both see the same moments of a noisy shared machine;
reported: generated tokens per second over the whole run (prefill included), and prompt tokens per second of a
prefill-only pass (max_tokens 1, all prompts at once). Then the determinism itself: each engine's requests at the
widest level, alone (one at a time) against batched, compared token for token and on the chosen tokens'
log-probabilities to the bit. The last line printed is one JSON object (also bench/results/determinism.json).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from backend.config import EngineConfig, engine_config_from_env
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template
from bench.report import emit
from bench.throughput import questions_for

DEFAULT_OUT = Path(__file__).parent / "results" / "determinism.json"


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, dict[str, tuple]]:
    """(wall seconds, request id -> (token ids, chosen-token logprobs)) for all prompts submitted at once."""
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    out: dict[str, tuple[list[int], list[float]]] = {}
    start = time.perf_counter()
    while engine.has_work:
        for o in engine.step():
            toks, lps = out.setdefault(o.request_id, ([], []))
            for d in o.deltas:
                toks.extend(d.token_ids)
                lps.extend(lp.logprob for lp in d.logprobs or ())
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="", help="model directory (default: the serving configuration's)")
    parser.add_argument("--streams", default="1,16", help="concurrency levels, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    base = engine_config_from_env(EngineConfig(enable_prefix_caching=False))
    if args.model:
        base = replace(base, model=args.model)
    engines = {name: LLMEngine(replace(base, deterministic=on)) for name, on in (("on", True), ("off", False))}
    tok = engines["on"].tokenizer
    levels = [int(s) for s in args.streams.split(",")]
    prompts = [apply_chat_template(tok, [{"role": "user", "content": q}]) for q in questions_for(max(levels))]
    greedy = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True, logprobs=1)
    result: dict[str, Any] = {"new_tokens": args.new_tokens, "rounds": args.rounds, "levels": {}}
    for name, e in engines.items():
        run(e, prompts[:1], replace(greedy, max_tokens=2))  # warm-up
        result[f"int4_modes_{name}"] = sorted({getattr(m, "mode", "") for m in e.runner.model.modules() if hasattr(m, "mode")})
    for n in levels:
        walls: dict[str, list[float]] = {name: [] for name in engines}
        prefill: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, e in engines.items():
                walls[name].append(run(e, prompts[:n], greedy)[0])
                prefill[name].append(run(e, prompts[:n], replace(greedy, max_tokens=1))[0])
        prompt_tokens = sum(len(p) for p in prompts[:n])
        result["levels"][str(n)] = {
            name: {"gen_tok_s": round(n * args.new_tokens / min(walls[name]), 2),
                   "prefill_tok_s": round(prompt_tokens / min(prefill[name]), 1)}
            for name in engines
        }
        on, off = result["levels"][str(n)]["on"], result["levels"][str(n)]["off"]
        print(f"{n:3d} streams  gen tok/s on {on['gen_tok_s']:8.2f} off {off['gen_tok_s']:8.2f}   "
              f"prefill tok/s on {on['prefill_tok_s']:8.1f} off {off['prefill_tok_s']:8.1f}", flush=True)
    n = max(levels)
    for name, e in engines.items():
        batched = run(e, prompts[:n], greedy)[1]
        alone = {f"r{i}": run(e, [p], greedy)[1]["r0"] for i, p in enumerate(prompts[:n])}
        result[f"identical_alone_vs_batched_{name}"] = sum(alone[r] == batched[r] for r in alone)
    result["requests_compared"] = n
    return emit(result, args.out)


if __name__ == "__main__":
    main()
