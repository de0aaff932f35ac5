"""The 4-bit GPTQ checkpoint layout (AutoGPTQ / GPTQModel, as vLLM and TGI load it), converted to the engine's
INT4 form at load time.

For a linear layer W (out N, in K), with groups of g input channels:

    qweight (K/8, N) int32   8 consecutive INPUT channels per word, channel 8i+j in bits 4j..4j+3
    qzeros  (K/g, N/8) int32 8 consecutive OUTPUT columns per word, column 8c+j in bits 4j..4j+3
    scales  (K/g, N) fp16
    g_idx   (K,) int32       the group of each input channel
    W[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]

`checkpoint_format: gptq` (v1, AutoGPTQ's default) stores z - 1 in qzeros, so z = stored + 1; `gptq_v2` stores
z. Without act-order g_idx[k] = k // g. With act-order (`desc_act: true`) channels were quantized in
decreasing Hessian order, so a group's channels are scattered: sorting the channels by g_idx (`perm`) makes
every group contiguous again, W[:, perm] is an ordinary group-wise INT4 weight, and y = x[:, perm] @ W[:, perm].T.
So a GPTQ layer becomes AWQ-layout tensors (awq_format.pack) plus, under act-order, `in_perm`: the engine's
Int4Linear gathers its input columns by it and serves the layer with the same kernels as AWQ (CPU int4
and the Triton W4A16 GEMM).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from backend.quant.awq_format import QuantizedWeight, pack, unpack
from backend.quant.config import GptqConfig

GPTQ_TENSORS = ("qweight", "qzeros", "scales", "g_idx")
SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # nibble j sits at bits 4j


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 words in [0, 2^32) -> int32 with the same bits."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """(R, C) values 0..15 -> (R/8, C) int32, rows 8i..8i+7 in word i (qweight's packing)."""
    r, c = q.shape
    words = (q.long().view(r // 8, 8, c) << SHIFTS.long()[None, :, None]).sum(1)
    return _to_int32(words)


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """(R/8, C) int32 -> (R, C) uint8; the inverse of pack_rows."""
    r8, c = words.shape
    return ((words[:, None, :] >> SHIFTS[None, :, None]) & 15).reshape(r8 * 8, c).to(torch.uint8)


def pack_cols(q: torch.Tensor) -> torch.Tensor:
    """(R, C) values 0..15 -> (R, C/8) int32, columns 8c..8c+7 in word c (qzeros' packing)."""
    return pack_rows(q.T.contiguous()).T.contiguous()


def unpack_cols(words: torch.Tensor) -> torch.Tensor:
    return unpack_rows(words.T.contiguous()).T.contiguous()


def gptq_pack(q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, *, v1: bool = True
              ) -> dict[str, torch.Tensor]:
    """(out, in) integers, zeros / scales (groups, out), g_idx (in,) -> the four GPTQ tensors. v1 stores z - 1
    (a zero point of 0 cannot be stored in v1: AutoGPTQ's known overflow; use v2 for asymmetric weights)."""
    if v1 and bool((zeros == 0).any()):
        raise ValueError("a zero point of 0 cannot be stored in the GPTQ v1 format")
    stored = (zeros.long() - 1) if v1 else zeros.long()
    return {
        "qweight": pack_rows(q.T.contiguous()),
        "qzeros": pack_cols(stored & 15),
        "scales": scales.half().contiguous(),
        "g_idx": g_idx.to(torch.int32),
    }


def to_int4(t: dict[str, torch.Tensor], cfg: GptqConfig, name: str) -> dict[str, torch.Tensor]:
    """One GPTQ layer's tensors -> AWQ-layout qweight / qzeros / scales (+ in_perm under real act-order)."""
    q = unpack_rows(t["qweight"])  # (K, N)
    k, n = q.shape
    zeros = unpack_cols(t["qzeros"])[:, :n].long() + (1 if cfg.v1 else 0)  # (G, N)
    if bool((zeros > 15).any()):
        raise ValueError(f"{name}: zero point 16 (AutoGPTQ v1's overflow of a zero point of 0) is not supported")
    g = cfg.group_size
    g_idx = t["g_idx"].long() if "g_idx" in t else torch.arange(k) // g
    perm = torch.argsort(g_idx, stable=True)
    if not bool((g_idx[perm] == torch.arange(k) // g).all()):
        raise ValueError(f"{name}: g_idx does not split the input channels into groups of {g}")
    out: dict[str, torch.Tensor] = {}
    if not bool((perm == torch.arange(k)).all()):
        out["in_perm"] = perm
        q = q[perm]
    qw = QuantizedWeight(q.T.contiguous(), zeros.T.to(torch.uint8).contiguous(), t["scales"].T.half().contiguous())
    out.update(pack(qw))
    return out


def convert_gptq_tensors(hf: dict[str, torch.Tensor], cfg: GptqConfig) -> dict[str, torch.Tensor]:
    """Every GPTQ layer of a checkpoint (names without the `model.` prefix) in the engine's INT4 form."""
    layers = sorted(k.removesuffix(".qweight") for k in hf if k.endswith(".qweight"))
    out = {k: v for k, v in hf.items() if not k.endswith(GPTQ_TENSORS)}
    for name in layers:
        parts = {kind: hf[f"{name}.{kind}"] for kind in GPTQ_TENSORS if f"{name}.{kind}" in hf}
        out.update({f"{name}.{kind}": v for kind, v in to_int4(parts, cfg, name).items()})
    return out


def awq_to_gptq_checkpoint(awq_dir: Path, out_dir: Path) -> Path:
    """Rewrite an AWQ checkpoint's integers in the GPTQ v2 layout (same weights, no act-order): a GPTQ model
    for the bench without running GPTQ's algorithm."""
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(awq_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    layers = sorted(k.removesuffix(".qweight") for k in tensors if k.endswith(".qweight"))
    for name in layers:
        qw = unpack(tensors.pop(f"{name}.qweight"), tensors.pop(f"{name}.qzeros"), tensors.pop(f"{name}.scales"))
        g_idx = torch.arange(qw.q.shape[1]) // qw.group_size
        for kind, v in gptq_pack(qw.q, qw.zeros.T, qw.scales.T, g_idx, v1=False).items():
            tensors[f"{name}.{kind}"] = v
    save_file(tensors, str(partial / "model.safetensors"), metadata={"format": "pt"})
    for f in awq_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy2(f, partial / f.name)
    cfg = json.loads((awq_dir / "config.json").read_text())
    group = cfg["quantization_config"]["group_size"]
    cfg["quantization_config"] = GptqConfig(group_size=group, desc_act=False, sym=False, v1=False).to_json()
    (partial / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.replace(out_dir)
    return out_dir
