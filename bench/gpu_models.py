"""Random-weight checkpoints of real model shapes, written straight from the device, for `python -m bench.gpu`.

The GPU machines reach no model hub, and decode speed depends on shapes and formats, not values: each checkpoint is a
model directory the engine's own loader reads (config.json, safetensors, a tokenizer), in one of three formats:

    bf16   HF names and layout (what HF transformers `from_pretrained` reads too, for the peer)
    awq    AutoAWQ's GEMM packing, group 128 (qweight / qzeros / scales per projection)
    gguf   a GGUF's 4-bit blocks as backend/quant/gguf_blocks.py converts them (q4 / q4_scales / q4_mins, groups of 32)

Values are drawn on the device (seconds for 8B parameters), not on the host. The tokenizer is SmolLM2's (a folder
holding its tokenizer.json: `--tokenizer`); its ids are below every vocabulary here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                         max_position_embeddings=131072, rope_scaling={**LLAMA3_ROPE, "factor": 32.0}),
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=False,
                         max_position_embeddings=131072, rope_scaling={**LLAMA3_ROPE, "factor": 8.0}),
    # --dry-run: the same code paths at a size a CPU runs in seconds
    "toy": dict(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=4096),
}
FORMATS = ("bf16", "awq", "gguf")
AWQ_GROUP = 128
GGUF_BLOCK = 32
STD = 0.05  # wider than HF's 0.02 init: logits far enough apart that greedy ties are rare


@dataclass(frozen=True)
class Shape:
    name: str
    config: dict[str, Any]

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    def projections(self) -> dict[str, tuple[int, int]]:
        """Per layer: HF projection name -> (out_features, in_features)."""
        c = self.config
        h, d, hkv, hid, inter = (c[k] for k in ("num_attention_heads", "head_dim", "num_key_value_heads",
                                                 "hidden_size", "intermediate_size"))
        return {"self_attn.q_proj": (h * d, hid), "self_attn.k_proj": (hkv * d, hid), "self_attn.v_proj": (hkv * d, hid),
                "self_attn.o_proj": (hid, h * d), "mlp.gate_proj": (inter, hid), "mlp.up_proj": (inter, hid),
                "mlp.down_proj": (hid, inter)}

    def kv_bytes_per_token(self, elem: int = 2) -> int:
        c = self.config
        return self.layers * 2 * c["num_key_value_heads"] * c["head_dim"] * elem


def shape(name: str) -> Shape:
    return Shape(name, SHAPES[name])


def _randn(shape: tuple[int, ...], device: str, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(shape, device=device, generator=g, dtype=torch.float32) * STD).to(torch.bfloat16)


def _projection(fmt: str, out_f: int, in_f: int, device: str, *, g: torch.Generator) -> dict[str, torch.Tensor]:
    """One projection's tensors (suffix -> tensor) in the format's own layout."""
    if fmt == "bf16":
        return {"weight": _randn((out_f, in_f), device, g)}
    if fmt == "awq":  # (in, out / 8) words, zero points 0..15 packed alike, fp16 scales per group of 128 inputs
        words = lambda rows: torch.randint(-(2**31), 2**31 - 1, (rows, out_f // 8), device=device, generator=g,  # noqa: E731
                                           dtype=torch.int32)
        scales = (torch.rand(in_f // AWQ_GROUP, out_f, device=device, generator=g) * 0.01 + 0.002).half()
        return {"qweight": words(in_f), "qzeros": words(in_f // AWQ_GROUP), "scales": scales}
    # gguf blocks: (out, in / 2) bytes, d and m = -8 d (Q4_0) in fp16 per block of 32 inputs
    q4 = torch.randint(0, 256, (out_f, in_f // 2), device=device, generator=g, dtype=torch.int32).to(torch.uint8)
    d = (torch.rand(out_f, in_f // GGUF_BLOCK, device=device, generator=g) * 0.01 + 0.002).half()
    return {"q4": q4, "q4_scales": d, "q4_mins": -8 * d}


def write_checkpoint(sh: Shape, fmt: str, out: Path, tokenizer: Path, *, device: str, seed: int = 0) -> Path:
    """A model directory of `sh` in `fmt` with random values drawn on `device`; returns `out`."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    assert fmt in FORMATS, fmt
    g = torch.Generator(device=device).manual_seed(seed)
    c = sh.config
    hid, vocab = c["hidden_size"], c["vocab_size"]
    state: dict[str, torch.Tensor] = {"model.embed_tokens.weight": _randn((vocab, hid), device, g),
                                      "model.norm.weight": torch.ones(hid, dtype=torch.bfloat16, device=device)}
    if not c["tie_word_embeddings"]:
        state["lm_head.weight"] = _randn((vocab, hid), device, g)
    for i in range(sh.layers):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = torch.ones(hid, dtype=torch.bfloat16, device=device)
        state[p + "post_attention_layernorm.weight"] = torch.ones(hid, dtype=torch.bfloat16, device=device)
        for name, (out_f, in_f) in sh.projections().items():
            for suffix, t in _projection(fmt, out_f, in_f, device, g=g).items():
                state[f"{p}{name}.{suffix}"] = t
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file({k: v.cpu() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    config = LlamaConfig(**c, rms_norm_eps=1e-5, torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    if fmt == "awq":
        from backend.quant.config import AwqConfig

        config.quantization_config = AwqConfig(group_size=AWQ_GROUP).to_json()
    elif fmt == "gguf":
        from backend.quant.gguf_blocks import QUANT_METHOD

        config.quantization_config = {"quant_method": QUANT_METHOD, "bits": 4, "group_size": GGUF_BLOCK}
    config.save_pretrained(out)
    for f in tokenizer.iterdir():
        if f.name.startswith("tokenizer") or f.name in {"chat_template.jinja", "special_tokens_map.json"}:
            shutil.copy(f, out / f.name)
    (out / "bench_checkpoint.json").write_text(json.dumps({"shape": sh.name, "format": fmt, "random": True}))
    return out
