"""Int8Linear: y = x @ W.T + b with W held as int8 with one scale per output channel (weight-only INT8, W8A16).

Symmetric per-channel quantization: scale[n] = max_k |W[n, k]| / 127, q = round(W / scale) in [-127, 127],
W ~= q * scale. It needs no calibration and no checkpoint format: `EngineConfig.quantization = "int8"`
quantizes a full-precision model's projections at load time (backend/quant/convert.py).

CPU path: torch's `_weight_int8pack_mm` (bf16 activations, int8 weight, bf16 scales) reads a quarter of the
fp32 bytes, so decode steps (a few rows: memory bound) run faster. It streams the weight again for each
row, so from DENSE_ROWS rows on (prefill) a call instead dequantizes the weight once and runs a dense GEMM
(bf16, or fp32 on an AVX2-only CPU: `cpu_gemm.dense_dtype`). On CUDA the layer keeps a bf16 weight
(`F.linear`); int8 then only saves load-time memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from backend.cpu_gemm import dense_dtype

DENSE_ROWS = 32  # from this many rows on, dequantize + dense GEMM beats the int8 kernel (measured crossover 32-64)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (out, in) int8, scale (out,) float32) with w ~= q * scale[:, None]."""
    scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127
    q = (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_int8(weight.detach())
        self.bias = None if bias is None else bias.detach().float()
        self.on_cpu = weight.device.type == "cpu"
        if self.on_cpu:
            self.weight_int8, self.scale = q, scale.to(torch.bfloat16)
            self.dense_dtype = dense_dtype(weight.device)  # of the prefill path's dequantized weight
        else:  # no int8 GEMM of ours on CUDA: serve the (rounded) bf16 weight
            self.weight_bf16 = (q.float() * scale[:, None]).to(torch.bfloat16)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8={self.on_cpu}"

    def dequantized(self) -> torch.Tensor:
        """The float32 (out, in) weight this layer computes with."""
        if not self.on_cpu:
            return self.weight_bf16.float()
        return self.weight_int8.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if not self.on_cpu:
            y = F.linear(rows.to(torch.bfloat16), self.weight_bf16)
        elif rows.shape[0] < DENSE_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16).contiguous(), self.weight_int8, self.scale)
        else:
            dt = self.dense_dtype
            y = F.linear(rows.to(dt), self.weight_int8.to(dt) * self.scale.to(dt)[:, None])
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> int:
        if not self.on_cpu:
            return self.weight_bf16.numel() * 2
        return self.weight_int8.numel() + self.scale.numel() * 2
