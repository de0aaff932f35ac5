"""The GPU tier at the sizes people serve: ``python -m bench.gpu``.

    python -m bench.gpu [--only ceilings,kernels,engine,hf,hf_compile] [--models llama-3.2-1b,llama-3.1-8b]
                        [--formats bf16,awq,gguf,grouped] [--budget-s 460] [--tokenizer DIR] [--work DIR]
    python -m bench.gpu --only ceilings,kernels.grouped,engine,hf --models gemma-3-270m --formats bf16,grouped
    python -m bench.gpu --dry-run     # every section at toy shapes on the CPU (interpreter kernels, no timings)

One run on one GPU, random weights of real shapes (bench/gpu_models.py: Llama-3.2-1B and Llama-3.1-8B configs, Gemma 3
270M's; SmolLM2's tokenizer), in sections, each written to the result file as soon as it ends, so a run cut short keeps
what it measured:

1. ceilings: the device's measured copy bandwidth and bf16 matmul rate (the roofline's denominators).
2. kernels: the Triton kernels' own GPU time (CUDA-graph replay) against torch's on the same data
   (bench/gpu_kernels.py); `kernels.NAME` runs one part (gemm, grouped, decode, prefill).
3. engine, per model and format (bf16; AWQ INT4 W4A16, group 128; GGUF 4-bit blocks, group 32; a GGUF K-quant mix as
   grouped int8, the form a GPU serves Gemma 3's Q4_K_M file in; Gemma 3 takes bf16 and grouped only):
   - decode tok/s at 1, 32 and 128 streams, 128 new tokens each after a 64-token prompt (greedy, ignore_eos, CUDA graphs);
     at 1 stream the share of the HBM roofline: (weight bytes + KV bytes read per step) / step time / copy bandwidth;
   - TTFT at 2k and 16k prompt tokens (one request, prefill in one chunk);
   - bf16 (not 8B): greedy tokens with and without CUDA graphs, the same 32 prompts (identical or not).
4. hf: HF transformers `generate` with a static cache on the same checkpoints and prompts (1 and 128 streams, bf16),
   uncompiled; hf_compile: the same with torch.compile (last, only if the budget leaves time for its compilation).

A section that would not fit in what is left of --budget-s is skipped and listed as such. The last line printed is one
JSON object, also written to bench/results/cuda/gpu.json (--out) with the device, torch/Triton versions and the commit.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

if not torch.cuda.is_available():  # must precede the first import of triton (--dry-run on a CPU)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench import gpu_kernels, gpu_models
from bench.report import RESULTS, emit

STREAMS = (1, 32, 128)
NEW_TOKENS = 128
PROMPT_TOKENS = 64
TTFT_TOKENS = (2048, 16384)
MAX_MODEL_LEN = 16384 + 256
# rough seconds each part needs on an H100/H200 (checkpoint, load, graph capture, Triton compilation included): a part
# is skipped when less than this is left of the budget
COST_S = {"ceilings": 5, "kernels": 160, "hf": 25, "hf_compile": 150,
          ("llama-3.2-1b", "bf16"): 45, ("llama-3.2-1b", "awq"): 35, ("llama-3.2-1b", "gguf"): 35,
          ("llama-3.1-8b", "bf16"): 75, ("llama-3.1-8b", "awq"): 55, ("llama-3.1-8b", "gguf"): 55,
          ("gemma-3-270m", "bf16"): 30, ("gemma-3-270m", "grouped"): 30}


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def allows(self, cost: float) -> bool:
        return self.left() >= cost


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts(count: int, length: int, seed: int) -> list[list[int]]:
    """Distinct random token ids (below SmolLM2's vocabulary): no two share a prefix the cache could serve."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 49000, (count, length), generator=g).tolist()


# ---- the engine ----------------------------------------------------------------------------------
def make_engine(model_dir: Path, device: str, dry: bool, **overrides: Any):
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine

    settings: dict[str, Any] = dict(
        model=str(model_dir), device=device, dtype="bfloat16" if device == "cuda" else "float32", quantization="none",
        max_model_len=512 if dry else MAX_MODEL_LEN, max_num_seqs=max(STREAMS),
        max_num_batched_tokens=512 if dry else max(TTFT_TOKENS), kv_cache_memory_mb=64 if dry else 8192,
        num_speculative_tokens=0, enable_prefix_caching=True, cuda_graphs=True,
    )
    settings.update(overrides)
    return LLMEngine(EngineConfig(**settings))


def run_requests(engine: Any, batch: list[list[int]], new_tokens: int, tag: str) -> dict[str, Any]:
    """Submit every prompt at once, step to the end: wall times and each request's tokens."""
    from backend.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    sync()
    t0 = time.perf_counter()
    for i, p in enumerate(batch):
        engine.add_request(f"{tag}-{i}", p, params)
        tokens[f"{tag}-{i}"] = []
    t_first = None
    while engine.has_work:
        for out in engine.step():
            for delta in out.deltas:
                tokens[out.request_id].extend(delta.token_ids)
        if t_first is None and all(tokens.values()):
            sync()
            t_first = time.perf_counter()
    sync()
    t_end = time.perf_counter()
    return {"t_submit": t0, "t_first": t_first or t_end, "t_end": t_end,
            "tokens": [tokens[f"{tag}-{i}"] for i in range(len(batch))]}


def weight_bytes_per_step(model: torch.nn.Module) -> int:
    """Bytes of weights one decode step reads: every projection and norm, the LM head; the embedding table only where
    it is the LM head too (a step reads one of its rows otherwise). INT4 layers, the INT4 models' LM head copy and a
    GGUF's grouped layers (a tied head over the embedding's tensors once) count as they are prepared on this device."""
    from backend.quant.gguf_linear import GgufLinear
    from backend.quant.int4_linear import Int4Linear
    from backend.quant.lm_head import LowBitHead

    seen: set[int] = set()
    total, prepared = 0, []
    for name, mod in model.named_modules():
        if any(name.startswith(p) for p in prepared):
            continue
        if isinstance(mod, GgufLinear):  # its tensors are plain attributes, not parameters
            if id(mod.weight_q) not in seen:
                seen.add(id(mod.weight_q))
                total += mod.weight_bytes()
            continue
        if isinstance(mod, Int4Linear | LowBitHead):
            prepared.append(name + ".")
            total += mod.weight_bytes() if isinstance(mod, Int4Linear) else sum(mod.weight_bytes().values())
            continue
        for p in mod.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel() * p.element_size()
    embed, head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    table = getattr(embed, "weight", None)  # a grouped embedding's tensors are no parameter: counted as the head's
    if table is not None and head is not None and not any(p is table for p in head.parameters()):
        total -= table.numel() * table.element_size()
    return total


def bench_engine(sh: gpu_models.Shape, fmt: str, model_dir: Path, device: str, *, dry: bool, ceil: gpu_kernels.Ceilings,
                 new_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    engine = make_engine(model_dir, device, dry)
    res: dict[str, Any] = {"model": sh.name, "format": fmt, "load_s": round(time.perf_counter() - t0, 1),
                           "kernels": engine.output_identity["layers"], "graphs": engine.runner.graph_stats.captured}
    model = engine.runner.model
    res["weight_bytes_per_step"] = weight_bytes_per_step(model)
    run_requests(engine, prompts(2, PROMPT_TOKENS, seed=99), 4, "warm")
    levels = {}
    for s in STREAMS:
        r = run_requests(engine, prompts(s, PROMPT_TOKENS, seed=s), new_tokens, f"s{s}")
        decode_s = r["t_end"] - r["t_first"]
        level = {"streams": s, "tok_s": round(s * new_tokens / (r["t_end"] - r["t_submit"]), 1),
                 "decode_tok_s": round(s * (new_tokens - 1) / decode_s, 1) if decode_s > 0 else None,
                 "prefill_s": round(r["t_first"] - r["t_submit"], 4)}
        if s == 1 and decode_s > 0:
            step_s = decode_s / (new_tokens - 1)
            kv = sh.kv_bytes_per_token() * (PROMPT_TOKENS + new_tokens / 2)  # the average context read per step
            level.update({"step_ms": round(step_s * 1e3, 3), "kv_bytes_per_step": int(kv),
                          "hbm_roofline_share": gpu_kernels._share(res["weight_bytes_per_step"] + kv, step_s * 1e6,
                                                                   ceil.copy_bytes_per_s)})
        if s == 32:
            res["greedy_tokens_s32"] = r["tokens"]
        levels[str(s)] = level
    res["decode"] = levels
    res["graph_replays"] = dict(engine.runner.graph_stats.replays)
    graphs = engine.runner.graphs
    if graphs is not None and 1 in graphs.graphs:  # the GPU's share of a 1-stream step: its graph replayed alone
        replay = graphs.graphs[1].replay
        gpu_ms = gpu_kernels.event_ms(lambda: [replay() for _ in range(20)], reps=5) / 20
        one = levels["1"]
        one["gpu_step_ms"] = round(gpu_ms, 4)
        one["hbm_roofline_share_gpu_only"] = gpu_kernels._share(
            res["weight_bytes_per_step"] + one["kv_bytes_per_step"], gpu_ms * 1e3, ceil.copy_bytes_per_s)
    ttft = {}
    run_requests(engine, prompts(1, 256 if dry else TTFT_TOKENS[0], seed=7), 1, "ttft-warm")
    for n in (256,) if dry else TTFT_TOKENS:
        r = run_requests(engine, prompts(1, n, seed=n), 1, f"ttft{n}")
        ttft[str(n)] = round((r["t_first"] - r["t_submit"]) * 1e3, 2)
    res["ttft_ms"] = ttft
    del engine, model
    free_memory()
    return res


def greedy_graphs_check(model_dir: Path, device: str, dry: bool, with_graphs: list[list[int]], *, new_tokens: int) -> dict:
    """The same 32 prompts with CUDA graphs off: are the greedy tokens identical?"""
    engine = make_engine(model_dir, device, dry, cuda_graphs=False)
    r = run_requests(engine, prompts(32, PROMPT_TOKENS, seed=32), new_tokens, "eager")
    del engine
    free_memory()
    same = sum(a == b for a, b in zip(with_graphs, r["tokens"], strict=True))
    first_diff = [next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
                  for a, b in zip(with_graphs, r["tokens"], strict=True)]
    return {"prompts": len(with_graphs), "identical": same, "first_difference_at": [d for d in first_diff if d is not None]}


# ---- HF transformers generate --------------------------------------------------------------------
def bench_hf(model_dir: Path, device: str, dry: bool, compiled: bool, *, new_tokens: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, device_map=device).eval()
    res: dict[str, Any] = {"compiled": compiled}
    for s in STREAMS[:1] + STREAMS[-1:]:
        ids = torch.tensor(prompts(s, PROMPT_TOKENS, seed=s), device=device)
        kw = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0, eos_token_id=None,
                  cache_implementation="static", disable_compile=not compiled)
        with torch.inference_mode():
            # warm-up at the timed length: the static cache is sized by it, so a shorter warm-up would leave the
            # compilation for the timed run (seen: 4.1 tok/s for torch.compile at 1 stream on an H200)
            model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            sync()
            t0 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            sync()
        wall = time.perf_counter() - t0
        res[str(s)] = {"streams": s, "tok_s": round(s * (out.shape[1] - ids.shape[1]) / wall, 1), "wall_s": round(wall, 3)}
    del model
    free_memory()
    return res


# ---- the run -------------------------------------------------------------------------------------
def targets(result: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, read off this run's figures (None where a figure is missing)."""
    eng = {f"{r['model']}/{r['format']}": r for r in result.get("engine", []) if "decode" in r}
    hf = result.get("hf", {})
    kern = result.get("kernels", {})

    def dec(key: str, s: str, field: str = "decode_tok_s") -> float | None:
        return eng.get(key, {}).get("decode", {}).get(s, {}).get(field)

    out: dict[str, Any] = {}
    share = dec("llama-3.2-1b/bf16", "1", "hbm_roofline_share")
    out["1b_bf16_hbm_roofline_share_1_stream"] = {"value": share, "target": 0.6}
    e128, h1 = dec("llama-3.2-1b/bf16", "128", "tok_s"), hf.get("llama-3.2-1b", {}).get("1", {}).get("tok_s")
    h128 = hf.get("llama-3.2-1b", {}).get("128", {}).get("tok_s")
    out["1b_bf16_128_streams_vs_hf"] = {"vs_hf_1_stream": round(e128 / h1, 2) if e128 and h1 else None,
                                        "vs_hf_128_streams": round(e128 / h128, 2) if e128 and h128 else None,
                                        "target": 25}
    a, b = dec("llama-3.1-8b/awq", "1"), dec("llama-3.1-8b/bf16", "1")
    out["8b_int4_vs_bf16_1_stream"] = {"value": round(a / b, 2) if a and b else None, "target": 2.5}
    small = [r["speedup_vs_cublas"] for r in kern.get("gemm", []) if r.get("m", 99) <= 16 and "speedup_vs_cublas" in r]
    out["w4a16_vs_cublas_m_le_16"] = {"min": min(small, default=None), "target": 2.5}
    grouped = [r["speedup_vs_cublas"] for r in kern.get("grouped", []) if r.get("m", 99) <= 16 and "speedup_vs_cublas" in r]
    # 1.125-1.375 bytes a weight against bf16's 2: at decode sizes (memory-bound) up to 1.45-1.78x cuBLAS on the dequantized copy
    out["grouped_int8_vs_cublas_m_le_16"] = {"min": min(grouped, default=None), "target": 1.4}
    dec_rows = kern.get("decode", [])
    flash = [r["sdpa_flash"]["triton_time_ratio"] for r in dec_rows
             if isinstance(r.get("sdpa_flash"), dict) and "triton_time_ratio" in r["sdpa_flash"]]
    out["paged_decode_time_vs_sdpa_flash"] = {"max": max(flash, default=None), "target_at_most": 1 / 0.9}
    b32 = [r.get("triton", {}).get("share_of_copy_bw") for r in dec_rows if r.get("batch") == 32 and r.get("context") == 4096]
    out["paged_decode_b32_4k_bw_share"] = {"value": b32, "target": 0.6}
    pre = [r["sdpa_flash"]["triton_time_ratio"] for r in kern.get("prefill", [])
           if isinstance(r.get("sdpa_flash"), dict) and "triton_time_ratio" in r["sdpa_flash"]]
    out["flash_prefill_time_vs_sdpa_flash"] = {"max": max(pre, default=None), "target_at_most": 1 / 0.8}
    greedy = next((r.get("greedy_graphs_check") for r in result.get("engine", []) if "greedy_graphs_check" in r), None)
    out["greedy_identical_with_and_without_graphs_1b_bf16"] = greedy
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description="GPU tier bench (see the module docstring)")
    ap.add_argument("--dry-run", action="store_true", help="toy shapes on the CPU: every code path, no timings")
    ap.add_argument("--only", default="ceilings,kernels,engine,hf,hf_compile")
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--formats", default="bf16,awq,gguf")
    ap.add_argument("--budget-s", type=float, default=460.0, help="skip what would not finish in this many seconds")
    ap.add_argument("--tokenizer", type=Path, default=None, help="a folder with SmolLM2's tokenizer.json")
    ap.add_argument("--work", type=Path, default=Path("/tmp/smolgate-bench-gpu"), help="where checkpoints are written")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dry = args.dry_run
    device = "cuda" if torch.cuda.is_available() and not dry else "cpu"
    if device == "cpu" and not dry:
        print("no CUDA device: run with --dry-run to check the code paths on a CPU", file=sys.stderr)
        return 2
    if device == "cpu":
        import kernels

        kernels.use_interpreter()
    budget = Budget(args.budget_s)
    only = set(args.only.split(","))
    models = ["toy", "toy-gemma"] if dry else args.models.split(",")
    formats = args.formats.split(",")
    new_tokens = 8 if dry else NEW_TOKENS
    tokenizer = args.tokenizer or _default_tokenizer()
    out = args.out or (RESULTS / "cuda" / ("gpu_dry_run.json" if dry else "gpu.json"))
    import triton

    result: dict[str, Any] = {
        "bench": "gpu", "dry_run": dry, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__, "triton": triton.__version__, "settings": {
            "streams": STREAMS, "new_tokens": new_tokens, "prompt_tokens": PROMPT_TOKENS, "ttft_tokens": TTFT_TOKENS,
            "max_model_len": MAX_MODEL_LEN, "weights": "random, real shapes", "budget_s": args.budget_s},
        "skipped": [], "errors": {}, "timings_s": {},
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        result["sm_count"], result["memory_gib"] = props.multi_processor_count, round(props.total_memory / 2**30, 1)

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")

    def section(name: str, cost: float, fn: Callable[[], Any]) -> Any:
        if not budget.allows(0 if dry else cost):
            result["skipped"].append(f"{name} (needs ~{cost} s, {budget.left():.0f} s left)")
            print(f"skip   {name}: ~{cost} s needed, {budget.left():.0f} s left", flush=True)
            return None
        t0 = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:  # one failed section must not lose the others' figures
            import traceback

            result["errors"][name] = f"{type(exc).__name__}: {exc}"[:600]
            traceback.print_exc()
            value = None
        result["timings_s"][name] = round(time.perf_counter() - t0, 1)
        print(f"done   {name} in {result['timings_s'][name]} s ({budget.left():.0f} s left)", flush=True)
        free_memory()
        save()
        return value

    ceil = gpu_kernels.Ceilings(float("nan"), float("nan"))
    if "ceilings" in only:
        ceil = section("ceilings", COST_S["ceilings"], lambda: gpu_kernels.measure_ceilings(device)) or ceil
        result["ceilings"] = {"copy_GBps": round(ceil.copy_bytes_per_s / 1e9, 1),
                              "bf16_TFLOPs": round(ceil.bf16_flops_per_s / 1e12, 1)}
    parts = [(part, fn) for part, fn in (("gemm", gpu_kernels.bench_gemm), ("grouped", gpu_kernels.bench_grouped),
                                         ("decode", gpu_kernels.bench_decode), ("prefill", gpu_kernels.bench_prefill))
             if {"kernels", f"kernels.{part}"} & only]  # --only kernels: all four; kernels.grouped: that one
    if parts:
        result["kernels"] = {}
        for part, fn in parts:
            result["kernels"][part] = section(f"kernels.{part}", COST_S["kernels"] / len(parts),
                                              lambda f=fn: f(device, ceil, dry))
    result["engine"], result["hf"] = [], {}
    for name in models:
        sh = gpu_models.shape(name)
        for fmt in formats:
            if fmt not in sh.formats:
                result["skipped"].append(f"{name}/{fmt} (not a format {name} comes in: {', '.join(sh.formats)})")
                continue
            if "engine" not in only and not (fmt == "bf16" and {"hf", "hf_compile"} & only):
                continue
            key = f"{name}/{fmt}"
            cost = COST_S.get((name, fmt), 10)
            if not budget.allows(0 if dry else cost):
                result["skipped"].append(f"{key} (needs ~{cost} s, {budget.left():.0f} s left)")
                continue
            model_dir = section(f"checkpoint {key}", 0, lambda s=sh, f=fmt: gpu_models.write_checkpoint(
                s, f, args.work / f"{s.name}-{f}", tokenizer, device=device))
            if model_dir is None:
                continue
            if "engine" in only:
                res = section(f"engine {key}", 0, lambda s=sh, f=fmt, d=model_dir: bench_engine(
                    s, f, d, device, dry=dry, ceil=ceil, new_tokens=new_tokens))
                if res is not None:
                    if fmt == "bf16" and name != "llama-3.1-8b":
                        res["greedy_graphs_check"] = section(
                            f"greedy {key}", 15, lambda d=model_dir, t=res["greedy_tokens_s32"]: greedy_graphs_check(
                                d, device, dry, t, new_tokens=new_tokens))
                    res.pop("greedy_tokens_s32", None)
                    result["engine"].append(res)
            if fmt == "bf16" and "hf" in only:
                hf = section(f"hf {key}", COST_S["hf"], lambda d=model_dir: bench_hf(d, device, dry, False,
                    new_tokens=new_tokens))
                if hf is not None:
                    result["hf"][name] = hf
            if fmt != "bf16" or name != models[0] or "hf_compile" not in only:
                import shutil

                shutil.rmtree(model_dir, ignore_errors=True)
    if "hf_compile" in only and models:
        model_dir = args.work / f"{models[0]}-bf16"
        if model_dir.exists():
            hf = section(f"hf_compile {models[0]}", COST_S["hf_compile"],
                         lambda: bench_hf(model_dir, device, dry, True, new_tokens=new_tokens))
            if hf is not None:
                result["hf"][f"{models[0]} (torch.compile)"] = hf
    result["targets"] = targets(result)
    emit(result, out)
    return 0


def _default_tokenizer() -> Path:
    """SmolLM2's tokenizer: a copy carried to the GPU machine (.gpu_assets/tokenizer), else the fetched model's."""
    carried = Path(__file__).resolve().parent.parent / ".gpu_assets" / "tokenizer"
    if (carried / "tokenizer.json").exists():
        return carried
    from backend.config import default_model_path

    return default_model_path()


if __name__ == "__main__":
    sys.exit(main())
