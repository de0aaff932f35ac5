"""Int8Linear: y = x @ W.T + b with W held as int8 with one scale per output channel (weight-only INT8, W8A16).

Symmetric per-channel quantization: scale[n] = max_k |W[n, k]| / 127, q = round(W / scale) in [-127, 127],
W ~= q * scale. It needs no calibration and no checkpoint format: `EngineConfig.quantization = "int8"`
quantizes a full-precision model's projections at load time (backend/quant/convert.py).

CPU path: torch's `_weight_int8pack_mm` (bf16 activations, int8 weight, bf16 scales) reads a quarter of the
fp32 bytes, so decode steps (a few rows: memory bound) run faster. It streams the weight again for each
row, so from DENSE_ROWS rows on (prefill) a call instead dequantizes the weight once and runs a dense GEMM
(bf16, or fp32 on an AVX2-only CPU: `cpu_gemm.dense_dtype`). On CUDA the layer keeps a bf16 weight
(`F.linear`); int8 then only saves load-time memory.

With the W8A8 kernel (kernels/cpu/w8a8.c; `EngineConfig.deterministic` hands it in where the C kernels build) the
same int8 rows and scales serve every call: x is quantized per row and group to int8 and the products run on integer
SIMD, one reduction order per row whatever the row count (the torch path's two kernels round differently, so a
row's output depended on how many rows the call had: docs/determinism.md).
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from backend.quant.cpu_gemm import dense_dtype
from kernels.cpu.w8a8 import W8A8Weight, w8a8_group, w8a8_linear

DENSE_ROWS = 32  # from this many rows on, dequantize + dense GEMM beats the int8 kernel (measured crossover 32-64)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q (out, in) int8, scale (out,) float32) with w ~= q * scale[:, None]."""
    scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127
    q = (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Int8Linear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, w8a8: ctypes.CDLL | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_int8(weight.detach())
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.on_cpu = weight.device.type == "cpu"
        group = w8a8_group(self.in_features)
        self.w8a8_lib = w8a8 if self.on_cpu and group else None
        if self.w8a8_lib is not None:  # pack_w8a8's quantization is quantize_int8's: the same rows and scales
            self.w8a8 = W8A8Weight(q, scale.float().contiguous(), group)
            self.weight_int8, self.scale = q, scale.to(torch.bfloat16)  # weight_bytes() reads them
        elif self.on_cpu:
            self.weight_int8, self.scale = q, scale.to(torch.bfloat16)
            self.dense_dtype = dense_dtype(weight.device)  # of the prefill path's dequantized weight
        else:  # no int8 GEMM of ours on CUDA: serve the (rounded) bf16 weight
            self.weight_bf16 = (q.float() * scale[:, None]).to(torch.bfloat16)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8={self.on_cpu}, w8a8={self.w8a8_lib is not None}"

    def dequantized(self) -> torch.Tensor:
        """The float32 (out, in) weight this layer computes with."""
        if not self.on_cpu:
            return self.weight_bf16.float()
        if self.w8a8_lib is not None:
            return self.w8a8.q.float() * self.w8a8.scales[:, None]
        return self.weight_int8.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.w8a8_lib is not None:  # the bias added in the kernel's epilogue, in fp32
            y = w8a8_linear(self.w8a8_lib, rows.float().contiguous(), self.w8a8, self.bias)
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
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
