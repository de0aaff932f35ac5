"""Quantize a Llama-family checkpoint to AWQ INT4 (AutoAWQ "GEMM" layout), block by block.

    python -m backend.quant.awq MODEL_DIR OUT_DIR [--group-size 128] [--samples 32] [--seq-len 256] [--rtn]

Calibration text runs through the model one decoder layer at a time (only one layer's activations are
alive): each layer gets the AWQ scale search, folding and clipping search (awq_search.py), then its seven
projections are packed. `--rtn` skips calibration: plain round-to-nearest with the same group size (the
baseline the bench compares against). The group size falls back from 128 to 64 or 32 when the model's
dimensions need it (SmolLM2-135M: hidden size 576 -> 64).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from backend.quant.awq_format import pack, quantize, save_checkpoint
from backend.quant.awq_search import LINEARS, awq_layer
from backend.quant.calibration import calibration_batch
from backend.quant.config import AwqConfig, pick_group_size

DEFAULT_SAMPLES, DEFAULT_SEQ_LEN = 16, 256


def load_hf_model(model_dir: Path) -> nn.Module:
    """The full-precision HF model: its modules are the reference implementation AWQ hooks into."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def layer_inputs(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Layer 0's input (the embeddings) and the rotary (cos, sin) shared by every layer."""
    hidden = model.model.embed_tokens(ids)
    positions = torch.arange(ids.shape[1])[None, :]
    return hidden, model.model.rotary_emb(hidden, positions)


def packed_layer(layer: nn.Module, prefix: str, group_size: int, clips: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The layer's seven projections as AWQ tensors (plus biases), under their HF names."""
    out: dict[str, torch.Tensor] = {}
    for name in LINEARS:
        lin: nn.Linear = layer.get_submodule(name)
        for kind, t in pack(quantize(lin.weight.data, group_size, clips.get(name))).items():
            out[f"{prefix}{name}.{kind}"] = t
        if lin.bias is not None:
            out[f"{prefix}{name}.bias"] = lin.bias.data
    return out


def other_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Everything that stays in floating point: embeddings, norms (with AWQ's folded scales), untied lm_head."""
    linear_names = {f"{n}.{kind}" for n in LINEARS for kind in ("weight", "bias")}
    state = model.state_dict()
    keep = {k: v for k, v in state.items() if not any(k.endswith(n) for n in linear_names)}
    if model.config.tie_word_embeddings:
        keep.pop("lm_head.weight", None)
    return keep


@torch.no_grad()
def quantize_model(model_dir: Path, out_dir: Path, group_size: int = 128, method: str = "awq",
                   *, n_samples: int = DEFAULT_SAMPLES, seq_len: int = DEFAULT_SEQ_LEN, progress: bool = True,
                   calibration: torch.Tensor | None = None) -> Path:
    """Write an AWQ checkpoint of `model_dir` to `out_dir` (method "awq" or "rtn") and return out_dir.

    calibration: (n, seq_len) token ids to use instead of the shipped text (a model whose tokenizer cannot
    read English, e.g. a test's synthetic one)."""
    from transformers import AutoTokenizer

    model = load_hf_model(model_dir)
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    group_size = pick_group_size([cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * head_dim], group_size)
    hidden = pos_emb = None
    if method == "awq":
        ids = calibration if calibration is not None else calibration_batch(
            AutoTokenizer.from_pretrained(model_dir), n_samples, seq_len)
        hidden, pos_emb = layer_inputs(model, ids)
    elif method != "rtn":
        raise ValueError(f"unknown method {method!r}: awq or rtn")
    tensors: dict[str, torch.Tensor] = {}
    bar = tqdm(model.model.layers, desc=f"{method.upper()} g{group_size}", unit="layer", disable=not progress)
    for i, layer in enumerate(bar):
        clips: dict[str, torch.Tensor] = {}
        if hidden is not None and pos_emb is not None:
            clips, hidden, alphas = awq_layer(layer, hidden, pos_emb, group_size, head_dim=head_dim)
            bar.set_postfix_str("alpha " + "/".join(f"{a:.2f}" for a in alphas))
        tensors.update(packed_layer(layer, f"model.layers.{i}.", group_size, clips))
    tensors.update(other_tensors(model))
    return save_checkpoint(out_dir, tensors, cfg, AwqConfig(group_size=group_size), source_dir=model_dir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="full-precision HF safetensors directory")
    parser.add_argument("out_dir", type=Path, help="where the AWQ checkpoint goes (replaced if present)")
    parser.add_argument("--group-size", type=int, default=128, choices=(32, 64, 128))
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="calibration blocks")
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="tokens per calibration block")
    parser.add_argument("--rtn", action="store_true", help="plain round-to-nearest, no calibration")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    start = time.perf_counter()
    out = quantize_model(args.model_dir, args.out_dir, args.group_size, "rtn" if args.rtn else "awq", n_samples=args.samples,
                         seq_len=args.seq_len)
    print(f"wrote {out} in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
