"""Group-wise asymmetric INT4 and the AutoAWQ "GEMM" checkpoint layout (what vLLM, TGI and AutoAWQ read).

A linear layer y = x @ W.T with W (out, in) is stored as three tensors (K = in_features, N = out_features):

    qweight (K, N/8) int32   8 output columns per word, AWQ's interleaved nibble order
    qzeros  (K/g, N/8) int32 zero points 0..15, packed the same way
    scales  (K/g, N) fp16
    W[n, k] = (q[n, k] - zero[n, k // g]) * scale[n, k // g]

The nibble packing is kernels/triton/awq_gemm.py's reference `awq_pack` / `awq_unpack` (one copy of the format in
the repo). config.json carries quantization_config = {quant_method: awq, bits: 4, group_size: g,
zero_point: true, version: gemm}; every other tensor (embeddings, norms, an untied lm_head) stays fp16.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PretrainedConfig

from backend.quant.config import AwqConfig

MAX_Q = 15  # 4 bits, unsigned


@dataclass(frozen=True)
class QuantizedWeight:
    """Integers in (out, in) orientation: q (out, in), zeros (out, in/g), scales (out, in/g) fp16."""

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor

    @property
    def group_size(self) -> int:
        return self.q.shape[1] // self.scales.shape[1]


def quantize(w: torch.Tensor, group_size: int, max_abs: torch.Tensor | None = None) -> QuantizedWeight:
    """Min/max asymmetric INT4 per group of `group_size` input channels (AutoAWQ's rule), after clipping each
    group to [-max_abs, max_abs] when given (max_abs: (out, in/g), from the clipping search). Scales are
    rounded to fp16 before the integers are computed, so the stored checkpoint reproduces exactly this."""
    out, k = w.shape
    g = w.float().reshape(out, k // group_size, group_size)
    if max_abs is not None:
        g = torch.maximum(torch.minimum(g, max_abs[..., None]), -max_abs[..., None])
    lo, hi = g.amin(-1), g.amax(-1)
    scales = ((hi - lo).clamp(min=1e-5) / MAX_Q).half()
    s = scales.float()[..., None]
    zeros = (-(lo[..., None] / s).round()).clamp(0, MAX_Q)
    q = ((g / s).round() + zeros).clamp(0, MAX_Q)
    return QuantizedWeight(q.reshape(out, k).to(torch.uint8), zeros[..., 0].to(torch.uint8), scales)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """The float32 (out, in) weight the integers stand for."""
    out, k = qw.q.shape
    g = qw.q.float().reshape(out, -1, qw.group_size)
    return ((g - qw.zeros.float()[..., None]) * qw.scales.float()[..., None]).reshape(out, k)


def fake_quantize(w: torch.Tensor, group_size: int, max_abs: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize then dequantize, as float32: what the layer will compute with (the searches' error model).
    The same arithmetic as `quantize` + `dequantize`, in place on one buffer: the searches call it hundreds
    of times per layer."""
    out, k = w.shape
    g = w.float().reshape(out, k // group_size, group_size).clone()
    if max_abs is not None:
        g = torch.clamp(g, -max_abs[..., None], max_abs[..., None])
    lo, hi = g.aminmax(dim=-1)
    s = ((hi - lo).clamp_(min=1e-5) / MAX_Q).half().float()[..., None]
    zeros = (-lo[..., None] / s).round_().clamp_(0, MAX_Q)
    return g.div_(s).round_().add_(zeros).clamp_(0, MAX_Q).sub_(zeros).mul_(s).reshape(out, k)


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """(out, in) integers -> AWQ's qweight / qzeros / scales (transposed: in_features first)."""
    from kernels.triton.awq_gemm import awq_pack  # here, not at the top: importing triton holds ~70 MB

    return {
        "qweight": awq_pack(qw.q.T.contiguous()),
        "qzeros": awq_pack(qw.zeros.T.contiguous()),
        "scales": qw.scales.T.contiguous().half(),
    }


def unpack(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> QuantizedWeight:
    """AWQ tensors -> (out, in) integers; the inverse of `pack`."""
    from kernels.triton.awq_gemm import awq_unpack  # here, not at the top: importing triton holds ~70 MB

    q = awq_unpack(qweight).T.contiguous().to(torch.uint8)
    zeros = awq_unpack(qzeros).T.contiguous().to(torch.uint8)
    return QuantizedWeight(q, zeros, scales.T.contiguous())


def save_checkpoint(out_dir: Path, tensors: dict[str, torch.Tensor], config: PretrainedConfig, awq: AwqConfig,
                    *, source_dir: Path) -> Path:
    """Write model.safetensors + config.json (with quantization_config) and copy the tokenizer files from
    `source_dir`. Written into a sibling folder first and renamed, so a crash never leaves half a model."""
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for f in source_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in {"config.json", "model.safetensors.index.json"}:
            shutil.copy2(f, partial / f.name)
    stored = {n: (t if not t.is_floating_point() else t.half()).contiguous() for n, t in tensors.items()}
    save_file(stored, str(partial / "model.safetensors"), metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.update(quantization_config=awq.to_json(), dtype="float16", torch_dtype="float16")
    (partial / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.replace(out_dir)
    return out_dir
