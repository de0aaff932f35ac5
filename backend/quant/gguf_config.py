"""A GGUF file's transformers config: AutoConfig's mapping of its header, completed where that mapping drops what the
model needs.

For `phi3` transformers maps the scalars but drops three things llama.cpp's converter writes, each of which changes
the output: `rope.dimension_count` (Phi-4-mini turns 96 of each head's 128 dims: partial_rotary_factor 0.75),
`rope.scaling.original_context_length`, and the 128k variants' longrope factors, stored as two float32 tensors
(rope_factors_short / rope_factors_long, one factor per rotated pair) with `rope.scaling.attn_factor`. Without them a
Phi-4-mini file would load as a full rotary with plain rope angles and run, wrong. `complete_config` puts them where
Phi3Config keeps them (rope_parameters), so the rope tables are those of the checkpoint the file was converted from
(backend/model/rope.py) and a longrope file is served up to its original context (backend/model/arch.py:
context_limit). llama.cpp runs phi3 without a sliding window (it disables the one a file states); transformers'
mapping leaves none either, and so does the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from backend.quant.gguf_header import GgufError, GgufHeader, read_header

if TYPE_CHECKING:
    from transformers import PretrainedConfig

ROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")  # config, not weights


def gguf_config(gguf_path: Path) -> PretrainedConfig:
    """The transformers config `gguf_path` describes, complete."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    return complete_config(config, read_header(gguf_path))


def complete_config(config: PretrainedConfig, header: GgufHeader) -> PretrainedConfig:
    """`config` (transformers' mapping of `header`) with what the mapping drops put back, in place."""
    if header.architecture == "phi3":
        _phi3_rope(config, header)
    return config


def _phi3_rope(config: PretrainedConfig, header: GgufHeader) -> None:
    meta = header.metadata
    head_dim = config.hidden_size // config.num_attention_heads  # llama.cpp's phi3: n_embd / n_head
    dims = int(meta.get("phi3.rope.dimension_count", head_dim))  # type: ignore[call-overload]
    fraction = dims / head_dim
    if dims % 2 or not 0 < dims <= head_dim or int(head_dim * fraction) != dims:
        raise GgufError(f"{header.path.name}: phi3 rope.dimension_count {dims} does not fit heads of {head_dim} dims")
    params = dict(getattr(config, "rope_parameters", None) or {})
    params["partial_rotary_factor"] = config.partial_rotary_factor = fraction
    original = meta.get("phi3.rope.scaling.original_context_length")
    if isinstance(original, int):
        config.original_max_position_embeddings = original
    short, long = (header.f32_tensor(name) for name in ROPE_FACTORS)
    if short is not None or long is not None:
        if short is None or long is None or len(short) != dims // 2 or len(long) != dims // 2:
            raise GgufError(f"{header.path.name}: phi3 longrope needs rope_factors_short and rope_factors_long of "
                            f"{dims // 2} factors each (one per rotated pair)")
        if not isinstance(original, int):
            raise GgufError(f"{header.path.name}: phi3 longrope factors without rope.scaling.original_context_length")
        params.update(rope_type="longrope", short_factor=short.tolist(), long_factor=long.tolist(),
                      original_max_position_embeddings=original)
        attn = meta.get("phi3.rope.scaling.attn_factor")  # what llama.cpp scales cos and sin by (HF's attention_factor)
        if isinstance(attn, float):
            params["attention_factor"] = attn
    config.rope_parameters = params
