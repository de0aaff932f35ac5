"""What sets each supported architecture apart from Llama, read from its config once: one frozen record the model reads.

    llama, mistral, smollm3   the reference: pre-norm blocks, SwiGLU, one rope table (any rope_type transformers knows)
    qwen2                     q/k/v biases
    qwen3                     RMSNorm of each head's q and k before the rotary (QK-norm)
    phi3                      q/k/v and gate/up fused in the checkpoint (Phi-3, Phi-4-mini); a partial rotary
                              (partial_rotary_factor: the first dims of each head turn, the rest pass); longrope
                              configs served up to their original context (`context_limit`)
    gemma3_text               QK-norm; sandwich norms (after attention and after the MLP, and before the MLP); GeGLU
                              (tanh GELU); embeddings scaled by sqrt(hidden); norms store w and apply (1 + w); attention
                              scaled by query_pre_attn_scalar^-1/2; sliding and full layers (5:1) each with its own
                              rope base (rope_parameters per layer type)

Anything else is refused by name before any weight is read (`arch_of`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from backend.errors import ModelLoadError, ModelNotFoundError

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from backend.quant.gguf_header import GgufHeader

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "gemma3_text", "phi3")


class UnsupportedArchitecture(ModelLoadError):
    """An architecture (or a variant of one) the engine does not run."""


@dataclass(frozen=True)
class Arch:
    model_type: str
    qkv_bias: bool = False
    qk_norm: bool = False
    sandwich_norms: bool = False
    activation: str = "silu"  # silu (SwiGLU) | gelu_tanh (GeGLU)
    embed_scale: float | None = None  # multiply the embeddings by this (in the model's dtype), None: not at all
    norm_offset: bool = False  # norm weights stored as w, applied as 1 + w (the loader folds the 1 in)
    attn_scale: float | None = None  # None: head_dim^-1/2
    rope_by_layer_type: bool = False  # config.rope_parameters holds one entry per layer type
    rotary_fraction: float = 1.0  # the share of each head's dims the rotary turns (Phi-4-mini: 0.75), the rest pass

    @property
    def is_llama(self) -> bool:
        """The plain Llama block: what the fused CPU decode stack and the parallel layouts implement."""
        return not (self.qk_norm or self.sandwich_norms or self.embed_scale or self.rope_by_layer_type
                    or self.activation != "silu" or self.rotary_fraction != 1.0)


def arch_of(config: PretrainedConfig) -> Arch:
    kind = config.model_type
    if kind not in SUPPORTED:
        raise UnsupportedArchitecture(f"unsupported model type {kind!r}; supported: {', '.join(SUPPORTED)}")
    bias = bool(getattr(config, "attention_bias", False))
    if kind == "qwen2":
        return Arch(kind, qkv_bias=True)
    if kind == "qwen3":
        return Arch(kind, qkv_bias=bias, qk_norm=True)
    if kind == "gemma3_text":
        for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(config, cap, None) is not None:
                raise UnsupportedArchitecture(f"gemma3_text with {cap} is not supported")
        if getattr(config, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise UnsupportedArchitecture(f"gemma3_text with activation {config.hidden_activation!r} is not supported")
        return Arch(kind, qkv_bias=bias, qk_norm=True, sandwich_norms=True, activation="gelu_tanh",
                    embed_scale=float(config.hidden_size) ** 0.5, norm_offset=True,
                    attn_scale=float(config.query_pre_attn_scalar) ** -0.5, rope_by_layer_type=True)
    if kind == "phi3":  # q/k/v and gate/up fused in the checkpoint (our own layout), optionally partial rotary
        return Arch(kind, rotary_fraction=float(getattr(config, "partial_rotary_factor", None) or 1.0))
    return Arch(kind, qkv_bias=bias)


def context_limit(config: PretrainedConfig) -> int:
    """The longest context served exactly. `longrope` (Phi-3/4 128k configs) switches every position's angles from
    its short to its long factors once a sequence passes original_max_position_embeddings (transformers recomputes
    the whole sequence's rotary then): a KV cache written with one set cannot follow, so the context stops there."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if params.get("rope_type", params.get("type")) == "longrope":
        original = params.get("original_max_position_embeddings") or config.original_max_position_embeddings
        return min(int(config.max_position_embeddings), int(original))
    return int(config.max_position_embeddings)


def preflight(path: Path) -> GgufHeader | None:
    """Refuse a model the engine cannot serve in milliseconds, before torch is imported: the path must exist, a
    directory's config.json name a supported model type, a GGUF header a supported architecture. One-line errors.
    Returns a GGUF file's header (read once: the loader decides its conversion from it), None for a directory."""
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ModelNotFoundError(f"{path}: no config.json (need an HF model directory or a .gguf file)")
        try:
            kind = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{config}: unreadable ({exc})") from exc
        if kind not in SUPPORTED:
            raise UnsupportedArchitecture(f"{path.name}: unsupported model type {kind!r}; supported: {', '.join(SUPPORTED)}")
        return None
    if path.suffix != ".gguf" or not path.exists():
        raise ModelNotFoundError(f"model not found (need an HF directory or a .gguf file): {path}")
    from backend.quant.gguf_header import ARCHITECTURES, read_header

    header = read_header(path)
    if header.model_type is None:
        raise UnsupportedArchitecture(
            f"{path.name}: GGUF architecture {header.architecture!r} is not supported; supported: {', '.join(ARCHITECTURES)}")
    return header
