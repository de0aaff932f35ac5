"""Weight precisions side by side: fp32, INT8 (per-channel, quantized at load), AWQ INT4, and a GPTQ INT4 copy.

    python -m bench.quant [--streams 1,32] [--new-tokens 64] [--rounds 2] [--window 512] [--threads 1] [--no-gptq]

Perplexity on backend/quant/data/heldout.txt through the engine (prompt log-probabilities: exactly what is
served), then decode tokens/s at each stream count, the engines measured back to back per round; speedups
are the median of per-round ratios to fp32 (the machine is shared: compare ratios). bench.awq holds the
shared measuring functions. The GPTQ copy is the AWQ checkpoint's integers rewritten in the GPTQ layout
(backend/quant/gptq_format.py), so its perplexity must equal AWQ's: it checks the loader, not GPTQ's
algorithm. Writes bench/results/quant.json; the last line printed is the same JSON object.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

from backend.config import EngineConfig, cache_dir, default_awq_model_path, default_model_path
from backend.engine.llm_engine import LLMEngine
from backend.quant.calibration import HELDOUT, token_ids
from bench.awq import decode_tok_s, perplexity
from bench.report import default_out, emit


def make_engine(model_dir: Path, quantization: str, threads: int) -> LLMEngine:
    cfg = EngineConfig(model=str(model_dir), quantization=quantization, enable_prefix_caching=False, num_threads=threads)
    return LLMEngine(cfg)


def projection_bytes(engine: LLMEngine) -> int:
    """Bytes of the decoder projections' weights as the engine holds them."""
    total = 0
    for layer in engine.runner.model.layers:
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            total += m.weight_bytes() if hasattr(m, "weight_bytes") else m.weight.numel() * m.weight.element_size()
    return total


def gptq_copy(awq_dir: Path) -> Path:
    from backend.quant.gptq_format import awq_to_gptq_checkpoint

    out = cache_dir() / "models" / "gptq-from-awq" / awq_dir.name
    if not (out / "model.safetensors").exists():
        awq_to_gptq_checkpoint(awq_dir, out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fp-dir", type=Path, default=default_model_path())
    parser.add_argument("--awq-dir", type=Path, default=default_awq_model_path())
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--streams", default="1,32")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--no-gptq", action="store_true", help="skip the GPTQ copy")
    args = parser.parse_args(argv)
    torch.set_flush_denormal(True)
    engines = {
        "fp32": make_engine(args.fp_dir, "none", args.threads),
        "int8": make_engine(args.fp_dir, "int8", args.threads),
        "int4_awq": make_engine(args.awq_dir, "none", args.threads),
    }
    if not args.no_gptq:
        engines["int4_gptq"] = make_engine(gptq_copy(args.awq_dir), "none", args.threads)
    ids = token_ids(engines["fp32"].tokenizer, HELDOUT)
    ppl = {}
    for name, engine in engines.items():
        ppl[name], scored = perplexity(engine, ids, args.window)
        print(f"perplexity {name:9s} {ppl[name]:8.3f}  ({scored} held-out tokens)", flush=True)
    weights = {name: projection_bytes(e) for name, e in engines.items()}
    levels = [int(s) for s in args.streams.split(",")]
    tok_s: dict[str, dict[int, list[float]]] = {n: {s: [] for s in levels} for n in engines}
    for _ in range(args.rounds):
        for streams in levels:
            for name, engine in engines.items():  # alternate, so load changes hit all alike
                tok_s[name][streams].append(decode_tok_s(engine, streams, args.new_tokens))
                print(f"decode {name:9s} streams={streams:<3d} {tok_s[name][streams][-1]:8.1f} tok/s", flush=True)
    ratio = {
        name: {str(s): round(statistics.median(a / b for a, b in zip(tok_s[name][s], tok_s["fp32"][s], strict=True)), 3)
               for s in levels}
        for name in engines
    }
    result = {
        "bench": "quant", "threads": torch.get_num_threads(), "window": args.window, "heldout_tokens": scored,
        "perplexity": {k: round(v, 3) for k, v in ppl.items()},
        "perplexity_over_fp32": {k: round(v / ppl["fp32"], 4) for k, v in ppl.items()},
        "projection_bytes": weights,
        "projection_bytes_over_fp32": {k: round(v / weights["fp32"], 4) for k, v in weights.items()},
        "decode_tok_s": {n: {str(s): round(max(v), 1) for s, v in lv.items()} for n, lv in tok_s.items()},
        "decode_speedup_over_fp32": ratio,
        "new_tokens": args.new_tokens, "rounds": args.rounds,
    }
    emit(result, default_out("quant"))


if __name__ == "__main__":
    main()
