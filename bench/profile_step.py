"""Where one engine step goes: time decode steps at a given batch size and group the CPU time by op.

    python -m bench.profile_step --batch 32 --quantization auto    # the serving configuration
    python -m bench.profile_step --batch 1 --quantization none

It starts `batch` greedy requests (the throughput bench's questions), runs steps until every request is
decoding, times `--steps` pure decode steps (median), then profiles a few more with torch.profiler and
prints the top ops by self CPU time. torch.profiler does not see inside the C kernels (ctypes calls), so the step
is also timed by phase (`phases`, median ms of each piece called on its own over the same decode batch): the
scheduler, building the batch's tensors, the decoder layers (one C call with the decode stack), the final norm,
the lm_head, the sampler, and the rest of the step (postprocess: appending tokens, stop checks, detokenizing).
Last line: one JSON object (also bench/results/profile_step.json), with the C GEMMs' instruction set
(machine.kernel_isa in its provenance).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template
from backend.quant.gguf_linear import GgufLinear
from backend.quant.lm_head import LowBitHead
from bench import int8_peak
from bench.report import emit
from bench.throughput import questions_for
from kernels.cpu.build import cpu_isa
from kernels.cpu.wg8a8 import PackedGrouped

DEFAULT_OUT = Path(__file__).parent / "results" / "profile_step.json"


def start_requests(engine: LLMEngine, batch: int, max_tokens: int) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, question in enumerate(questions_for(batch)):
        chat = getattr(engine.tokenizer, "chat_template", None) is not None
        ids = apply_chat_template(engine.tokenizer, [{"role": "user", "content": question}]) if chat else \
            engine.tokenizer.encode(question)  # a base model (no chat template): the question as a completion prompt
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


@torch.inference_mode()
def phases(engine: LLMEngine, reps: int) -> dict[str, float]:
    """Median ms of each phase of a decode step, each called on its own `reps` times over one scheduled decode batch.
    The forward's pieces rerun the same step (the same KV slots rewritten with the same values), so nothing moves."""
    runner, model = engine.runner, engine.runner.model
    out = engine.scheduler.schedule()
    batch = runner.prepare(out)
    x = model.embed(batch)
    h, stream = model.run_layers(x, None, batch, runner.layer_caches)
    normed = model.final_norm(h, stream)
    logits = model.lm_head(normed).float()
    seqs = [chunk.seq for chunk in out.scheduled]

    def ms(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return round(statistics.median(times), 3)

    parts = {
        "prepare_batch": ms(lambda: runner.prepare(out)),
        "embed_and_rope": ms(lambda: model.ops.rope_table(batch.positions, model.rope.cos_sin, model.embed(batch).dtype)),
        "decoder_layers": ms(lambda: model.run_layers(x, None, batch, runner.layer_caches)),
        "final_norm": ms(lambda: model.final_norm(h, stream)),
        "lm_head": ms(lambda: model.lm_head(normed).float()),
        "sampler": ms(lambda: engine.sampler(logits, seqs)),
    }
    engine.postprocess(out, logits)  # the scheduled step completes (its token appended), as a real step would
    step = statistics.median(time_steps(engine, reps))
    parts["step"] = round(step, 3)
    parts["rest_of_step"] = round(step - sum(v for k, v in parts.items() if k != "step"), 3)  # schedule, postprocess
    return parts


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
    p.add_argument("--model", default="", help="HF model dir or .gguf (default: the fetched SmolLM2)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    config = EngineConfig(model=args.model, quantization=args.quantization, num_threads=args.threads,
                          enable_prefix_caching=False)
    engine = LLMEngine(config)
    # every timed, phased and profiled step, each as many tokens as a speculative step may give (the draft and one)
    steps = 2 * args.steps + args.profile_steps + 16
    start_requests(engine, args.batch, max_tokens=steps * (config.num_speculative_tokens + 1))
    warm_up(engine)
    times = time_steps(engine, args.steps)
    split = phases(engine, args.steps)
    ops = profile_steps(engine, args.profile_steps, args.top)
    for row in ops:
        print(f"{row['op']:<48} {row['calls']:>5} calls  {row['ms_per_step']:>8.2f} ms/step  {row['share']:>6.1%}")
    print("phases (ms): " + ", ".join(f"{k} {v}" for k, v in split.items()))
    result = {"bench": "profile_step", "model": engine.model_name, "batch": args.batch, "quantization": args.quantization,
              "threads": torch.get_num_threads(), "step_ms_p50": round(statistics.median(times), 2),
              "tok_s": round(args.batch * 1e3 / statistics.median(times), 1), "phases_ms": split, "top_ops": ops}
    roof = head_roof(engine, args.batch, split["lm_head"])
    if roof is not None:
        print(f"lm_head: {roof['gmac']} G multiply-adds, at least {roof['floor_ms']} ms at this CPU's {roof['isa']} "
              f"int8 rate ({roof['peak_gmac_s']} G/s): measured {roof['measured_ms']} ms, {roof['share_of_peak']:.0%} "
              "of the roof")
        result["lm_head_roof"] = roof
    return emit(result, args.out)


def head_roof(engine: LLMEngine, rows: int, measured_ms: float) -> dict[str, Any] | None:
    """The LM head's floor at this CPU's int8 rate (bench/int8_peak.py) where it is an int8 GEMM of the C kernels (a
    GGUF's head in the int8 layout: Q8_0; an INT4 model's W8A8 head), else None."""
    head = engine.runner.model.lm_head
    int8 = (isinstance(head, GgufLinear) and head.mode == "wg8a8" and isinstance(head.weight_q, PackedGrouped)
            and not head.weight_q.nibbles) or (isinstance(head, LowBitHead) and head.w8a8_lib is not None)
    if not int8:
        return None
    isa = cpu_isa()
    peak = int8_peak.peak_gmac_s(isa, torch.get_num_threads())
    gmac = rows * head.out_features * head.in_features / 1e9
    return {"isa": isa, "peak_gmac_s": round(peak, 1), **int8_peak.head_floor(gmac, peak, measured_ms)}


if __name__ == "__main__":
    main()
