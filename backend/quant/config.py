"""AWQ and GPTQ settings as config.json states them, read without importing torch kernels (the loader checks
every model).

quantization_config = {quant_method: "awq", bits: 4, group_size: 32 | 64 | 128, zero_point: true, version: "gemm"}
quantization_config = {quant_method: "gptq", bits: 4, group_size: 32 | 64 | 128, desc_act, sym,
                       checkpoint_format: "gptq" | "gptq_v2"}
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from transformers import PretrainedConfig

AWQ_TENSORS = ("qweight", "qzeros", "scales")
GROUP_SIZES = (128, 64, 32)


@dataclass(frozen=True)
class AwqConfig:
    group_size: int = 128
    bits: int = 4
    zero_point: bool = True
    version: str = "gemm"

    def to_json(self) -> dict[str, Any]:
        return {
            "quant_method": "awq", "bits": self.bits, "group_size": self.group_size,
            "zero_point": self.zero_point, "version": self.version, "modules_to_not_convert": None,
        }


def awq_config_of(config: PretrainedConfig) -> AwqConfig | None:
    """The checkpoint's AWQ settings, None for a full-precision checkpoint; other schemes are refused
    loudly (loading packed ints as floats would silently produce garbage)."""
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    q = q if isinstance(q, dict) else q.to_dict()
    method = q.get("quant_method")
    if method in {"gptq", "gguf_blocks", "gguf_grouped"}:
        return None  # gptq_config_of reads it; a GGUF's blocks are found by their tensors (backend/quant/gguf_blocks.py)
    if method != "awq":
        raise ValueError(f"unsupported quantization {method!r}: only AWQ, GPTQ and GGUF-block 4-bit checkpoints load")
    bits, group = q.get("bits", q.get("w_bit")), q.get("group_size", q.get("q_group_size"))
    version, zero_point = str(q.get("version", "gemm")).lower(), q.get("zero_point", True)
    if bits != 4 or version != "gemm" or not zero_point or group not in GROUP_SIZES:
        raise ValueError(f"unsupported AWQ variant (need 4-bit GEMM with zero points, group 32/64/128): {q}")
    return AwqConfig(group_size=int(group))


def pick_group_size(in_features: Iterable[int], requested: int) -> int:
    """`requested` if it divides every in_features, else the largest of 128/64/32 that does (SmolLM2's hidden
    size 576 is a multiple of 64 but not of 128)."""
    dims = list(in_features)
    for g in (requested, *GROUP_SIZES):
        if g <= requested and all(d % g == 0 for d in dims):
            return g
    raise ValueError(f"no group size in {GROUP_SIZES} divides the in_features {sorted(set(dims))}")


@dataclass(frozen=True)
class GptqConfig:
    group_size: int = 128
    desc_act: bool = False  # act-order: groups scattered over the input channels (g_idx)
    sym: bool = True
    v1: bool = True  # checkpoint_format "gptq" stores zero points minus one; "gptq_v2" stores them as they are

    def to_json(self) -> dict[str, Any]:
        return {
            "quant_method": "gptq", "bits": 4, "group_size": self.group_size, "desc_act": self.desc_act,
            "sym": self.sym, "checkpoint_format": "gptq" if self.v1 else "gptq_v2",
        }


def gptq_config_of(config: PretrainedConfig) -> GptqConfig | None:
    """The checkpoint's GPTQ settings, None when it is not a GPTQ checkpoint; variants the INT4 path cannot
    serve are refused with the reason."""
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    q = q if isinstance(q, dict) else q.to_dict()
    if q.get("quant_method") != "gptq":
        return None
    fmt = str(q.get("checkpoint_format", "gptq")).lower()
    if q.get("bits") != 4 or q.get("group_size") not in GROUP_SIZES or fmt not in {"gptq", "gptq_v2"}:
        raise ValueError(f"unsupported GPTQ variant (need 4 bits, group 32/64/128, format gptq or gptq_v2): {q}")
    return GptqConfig(int(q["group_size"]), bool(q.get("desc_act", False)), bool(q.get("sym", True)), fmt == "gptq")
