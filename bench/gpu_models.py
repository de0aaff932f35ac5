"""Random-weight checkpoints of real model shapes, written straight from the device, for `python -m bench.gpu`.

The GPU machines reach no model hub, and decode speed depends on shapes and formats, not values: each checkpoint is a
model directory the engine's own loader reads (config.json, safetensors, a tokenizer), in one of four formats:

    bf16     HF names and layout (what HF transformers `from_pretrained` reads too, for the peer)
    awq      AutoAWQ's GEMM packing, group 128 (qweight / qzeros / scales per projection)
    gguf     a GGUF's 4-bit blocks as backend/quant/gguf_blocks.py converts them (q4 / q4_scales / q4_mins, groups
             of 32)
    grouped  a K-quant mix as backend/quant/gguf_grouped.py converts it (int8 gq, fp32 gs / gz): what a GPU serves of a
             Q4_K_M file, here Gemma 3 270M's own mix (GROUPED_MIX), the embedding (the tied LM head) included

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
    # Gemma 3 270M: 5 sliding-window layers (512) to 1 global, one KV head of 256, a 262,144-token tied vocabulary
    "gemma-3-270m": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048,
                         num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                         tie_word_embeddings=True, max_position_embeddings=32768, sliding_window=512,
                         query_pre_attn_scalar=256),
    # --dry-run: the same code paths at a size a CPU runs in seconds
    "toy": dict(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, max_position_embeddings=4096),
    "toy-gemma": dict(model_type="gemma3_text", vocab_size=49152, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      tie_word_embeddings=True, max_position_embeddings=4096, sliding_window=64,
                      query_pre_attn_scalar=64,
                      layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
}
FORMATS = ("bf16", "awq", "gguf", "grouped")
# gemma-3-270m-q4_k_m.gguf's types by role (Q5_0, Q8_0: groups of 32; Q4_K: 32 with a term; Q6_K: 16) as
# (group, terms); ffn_down alternates Q4_K / Q6_K between layers
GROUPED_MIX = {"q_proj": (32, False), "k_proj": (32, False), "v_proj": (32, False), "o_proj": (32, True),
               "gate_proj": (32, False), "up_proj": (32, False), "down_proj": (32, True), "embed_tokens": (32, False)}
AWQ_GROUP = 128
GGUF_BLOCK = 32
STD = 0.05  # wider than HF's 0.02 init: logits far enough apart that greedy ties are rare


@dataclass(frozen=True)
class Shape:
    name: str
    config: dict[str, Any]

    @property
    def formats(self) -> tuple[str, ...]:
        """Gemma 3 comes as GGUF K-quant mixes (or bf16), not AWQ or Q4_0 blocks."""
        return ("bf16", "grouped") if self.config.get("model_type") == "gemma3_text" else FORMATS

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


def _grouped(out_f: int, in_f: int, mix: tuple[int, bool], *, device: str,
             g: torch.Generator) -> dict[str, torch.Tensor]:
    """int8 values, a float32 scale per group and (K-quants with a minimum) a float32 term per 32 inputs."""
    group, terms = mix
    out = {"gq": torch.randint(-128, 128, (out_f, in_f), device=device, generator=g, dtype=torch.int8),
           "gs": torch.rand(out_f, in_f // group, device=device, generator=g) * (STD / 64) + STD / 256}
    if terms:
        out["gz"] = torch.randn(out_f, in_f // 32, device=device, generator=g) * (STD / 8)
    return out


def _projection(fmt: str, out_f: int, in_f: int, device: str, *, g: torch.Generator,
                mix: tuple[int, bool]) -> dict[str, torch.Tensor]:
    """One projection's tensors (suffix -> tensor) in the format's own layout (`mix`: the grouped format's form)."""
    if fmt == "bf16":
        return {"weight": _randn((out_f, in_f), device, g)}
    if fmt == "grouped":
        return _grouped(out_f, in_f, mix, device=device, g=g)
    if fmt == "awq":  # (in, out / 8) words, zero points 0..15 packed alike, fp16 scales per group of 128 inputs
        words = lambda rows: torch.randint(-(2**31), 2**31 - 1, (rows, out_f // 8), device=device, generator=g,  # noqa: E731
                                           dtype=torch.int32)
        scales = (torch.rand(in_f // AWQ_GROUP, out_f, device=device, generator=g) * 0.01 + 0.002).half()
        return {"qweight": words(in_f), "qzeros": words(in_f // AWQ_GROUP), "scales": scales}
    # gguf blocks: (out, in / 2) bytes, d and m = -8 d (Q4_0) in fp16 per block of 32 inputs
    q4 = torch.randint(0, 256, (out_f, in_f // 2), device=device, generator=g, dtype=torch.int32).to(torch.uint8)
    d = (torch.rand(out_f, in_f // GGUF_BLOCK, device=device, generator=g) * 0.01 + 0.002).half()
    return {"q4": q4, "q4_scales": d, "q4_mins": -8 * d}


def _hf_config(sh: Shape) -> Any:
    from transformers import Gemma3TextConfig, LlamaConfig

    c = {k: v for k, v in sh.config.items() if k != "model_type"}
    common = dict(torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    if sh.config.get("model_type") == "gemma3_text":
        return Gemma3TextConfig(**c, **common)
    return LlamaConfig(**c, rms_norm_eps=1e-5, **common)


def grouped_mix(name: str, layer: int) -> tuple[int, bool]:
    """(group, terms) of projection `name` in layer `layer`: the form its type in the Gemma file has."""
    role = name.rsplit(".", 1)[-1]
    if role == "down_proj" and layer % 2:
        return (16, False)  # Q6_K
    return GROUPED_MIX[role]


def write_checkpoint(sh: Shape, fmt: str, out: Path, tokenizer: Path, *, device: str, seed: int = 0) -> Path:
    """A model directory of `sh` in `fmt` with random values drawn on `device`; returns `out`. The tensors' names and
    shapes are the HF model's own (built on the meta device); norms are 1 (Gemma's, stored as w - 1, are 0)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    assert fmt in FORMATS, fmt
    config = _hf_config(sh)
    with torch.device("meta"):
        names = {n: tuple(p.shape) for n, p in AutoModelForCausalLM.from_config(config).named_parameters()}
    g = torch.Generator(device=device).manual_seed(seed)
    norm = 0.0 if sh.config.get("model_type") == "gemma3_text" else 1.0
    state: dict[str, torch.Tensor] = {}
    for name, size in names.items():
        stem = name.removesuffix(".weight")
        if len(size) == 1:
            state[name] = torch.full(size, norm, dtype=torch.bfloat16, device=device)
        elif stem.endswith("embed_tokens") and fmt == "grouped":
            tensors = _grouped(*size, GROUPED_MIX["embed_tokens"], device=device, g=g)
            state.update({f"{stem}.{k}": t for k, t in tensors.items()})
        elif stem.endswith(("embed_tokens", "lm_head")):
            state[name] = _randn(size, device, g)
        else:
            layer = int(stem.split(".")[2])  # model.layers.<i>.<module>.<projection>
            tensors = _projection(fmt, *size, device, g=g, mix=grouped_mix(stem, layer))
            state.update({f"{stem}.{k}": t for k, t in tensors.items()})
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    save_file({k: v.cpu() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    del state
    if fmt == "awq":
        from backend.quant.config import AwqConfig

        config.quantization_config = AwqConfig(group_size=AWQ_GROUP).to_json()
    elif fmt == "gguf":
        from backend.quant.gguf_blocks import QUANT_METHOD

        config.quantization_config = {"quant_method": QUANT_METHOD, "bits": 4, "group_size": GGUF_BLOCK}
    elif fmt == "grouped":
        from backend.quant.gguf_grouped import QUANT_METHOD as GROUPED

        config.quantization_config = {"quant_method": GROUPED}
    config.save_pretrained(out)
    for f in tokenizer.iterdir():
        if f.name.startswith("tokenizer") or f.name in {"chat_template.jinja", "special_tokens_map.json"}:
            shutil.copy(f, out / f.name)
    (out / "bench_checkpoint.json").write_text(json.dumps({"shape": sh.name, "format": fmt, "random": True}))
    return out
