"""The lm_head's serving copy for INT4 models: int8 rows for decode-sized calls, a dense copy for batches.

Why not INT4 like the projections: the AWQ checkpoint keeps the lm_head in fp16 (that is the format), so
a low-bit copy made at load time gets no activation-aware help, and round-to-nearest INT4 (group 32) of
SmolLM2's tied 49152 x 576 head raised held-out perplexity by ~8% on its own; int8 with one scale per
vocabulary row costs ~0.1%. Speed (SmolLM2 shape, one core): torch's int8 weight-only matmul takes ~6 ms
for one row against ~13 ms in fp32, but it re-reads the weight per row and falls behind from ~4 rows on,
where the bf16 GEMM (AVX-512 BF16 / AMX, weight prepacked for oneDNN: backend/quant/cpu_gemm.py) is ~2.7x fp32
at 32 rows. So both copies are kept (1.5 bytes per weight, less than the fp32 head's 4); the full-precision
embedding table stays for the token lookup. An AVX2-only CPU keeps the dense copy in fp32 (its bf16 GEMM is
emulated: `cpu_gemm.dense_dtype`), where the int8 kernel wins up to ~8 rows. On CUDA only the bf16 copy is kept.

With the project's W8A8 kernel (kernels/cpu/w8a8.c: x86 AVX2, the INT4 models' default there) the int8 rows are
the only copy and serve every call: x is quantized per row and group of 64 to int8 and the products run on integer
SIMD; on x86 the rows are held in octets (w8a8_octets.h: 2.3x the row layout's speed at 32 rows with AVX-512).
On an AMD EPYC (AVX2), in the row layout, 49152x576 with the weight warm in cache: 2.9 / 4.6 ms at 4 / 8 rows against 5.8 / 8.9
(torch int8) and 7.9 / 9.3 (fp32 packed), 21.0 against 19.7 (fp32 packed) at 32 rows; but in a decode step the
head's weight comes from memory, and there a quarter of the bytes wins: 32-stream step 104.4 ms against 113.8
with the fp32 copy for batches (bench/README, "C kernels").
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from backend.quant.cpu_gemm import PackedLinear, dense_dtype
from backend.quant.kept_output import KeptOutput
from kernels.cpu.w8a8 import has_octets, pack_w8a8, w8a8_group, w8a8_linear

# fewer rows than this: int8 kernel; more: the dense GEMM (measured crossovers, by the dense copy's dtype)
INT8_MAX_ROWS = {torch.bfloat16: 4, torch.float32: 8}


class LowBitHead(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, w8a8: ctypes.CDLL | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w = weight.detach()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.kept_output: KeptOutput | None = None  # (backend/quant/kept_output.py; the W8A8 kernel writes into it)
        self.w8a8_lib = w8a8 if w.device.type == "cpu" and w8a8_group(self.in_features) else None
        if self.w8a8_lib is not None:  # in octets of rows where the kernel has them (x86) and there is no bias
            octets = has_octets(self.w8a8_lib) and self.out_features % 8 == 0 and self.bias is None
            self.w8a8, self.use_int8 = pack_w8a8(w, octets=octets), False
            return
        self.dense = PackedLinear(w.to(dense_dtype(w.device)))
        self.int8_max_rows = INT8_MAX_ROWS[self.dense.dtype]
        self.use_int8 = w.device.type == "cpu"
        if self.use_int8:
            scale = w.float().abs().amax(dim=1).clamp(min=1e-8) / 127
            self.weight_int8 = (w.float() / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous()
            self.scale = scale.to(torch.bfloat16)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8={self.use_int8}, w8a8={self.w8a8_lib is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.w8a8_lib is not None:  # the bias added in the kernel's epilogue, in fp32
            out = None if self.kept_output is None else self.kept_output.rows(rows.shape[0], self.out_features)
            y = w8a8_linear(self.w8a8_lib, rows.float().contiguous(), self.w8a8, self.bias, out=out)
            return y.to(x.dtype).view(*x.shape[:-1], self.out_features)
        if self.use_int8 and rows.shape[0] < self.int8_max_rows:
            y = torch.ops.aten._weight_int8pack_mm(rows.to(torch.bfloat16).contiguous(), self.weight_int8, self.scale)
        else:
            y = self.dense(rows.to(self.dense.dtype))
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def weight_bytes(self) -> dict[str, int]:
        if self.w8a8_lib is not None:
            return {"int8": self.w8a8.nbytes()}
        out = {"dense": self.dense.nbytes()}
        if self.use_int8:
            out["int8"] = self.weight_int8.numel() + self.scale.numel() * 2
        return out
