"""A GGUF file's block-quantized tensors as layers, in their own values (backend/quant/gguf_types.py):

    GgufLinear(weight)      y = x @ W^T on the grouped W8A8 kernel (kernels/cpu/wg8a8.c); where it cannot run (no C
                            compiler), torch on the weight dequantized for the call (the memory stays lean); on a GPU
                            (a weight in the column layout) the Triton grouped-int8 GEMM (kernels/triton/gguf_gemm.py)
    GgufEmbedding(weight)   the token lookup: the looked-up rows dequantized, no float copy of the table

Both hold their kernel's layout and nothing else: on a CPU kernels/cpu/wg8a8.py's PackedGrouped (octets of rows), on a
GPU kernels/triton/gguf_gemm.py's GroupedColumns (q transposed, on the device). A tied LM head
is a GgufLinear over the embedding's own tensors: Gemma 3's 262,144 x 640 table (168M weights, Q8_0) is held once, at
1.06 bytes a weight (its fp16 scales as they are), instead of a float32 table (4) plus an int8 head copy (1).

The tensors are plain attributes, not parameters or buffers: `model.to(dtype)` must not round the scales.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, TypeAlias

import torch
import torch.nn.functional as F
from torch import nn

from backend.quant.kept_output import KeptOutput
from kernels.cpu.wg8a8 import PackedGrouped, wg8a8_linear

if TYPE_CHECKING:  # a CPU never imports triton (~70 MB resident for nothing): GroupedColumns comes with a GPU's layout
    from kernels.triton.gguf_gemm import GroupedColumns

Grouped: TypeAlias = "PackedGrouped | GroupedColumns"


class GgufLinear(nn.Module):
    def __init__(self, weight: Grouped, lib: ctypes.CDLL | None) -> None:
        super().__init__()
        self.weight_q = weight
        self.out_features, self.in_features = weight.shape
        self.lib = lib
        self.kept_output: KeptOutput | None = None  # the LM head's (backend/quant/kept_output.py)
        # "triton": the column layout on its device (a GPU; the interpreter on a CPU); else the C kernel or torch
        self.mode = "triton" if not isinstance(weight, PackedGrouped) else "wg8a8" if lib is not None else "torch"

    def extra_repr(self) -> str:
        kernel = "triton" if self.mode == "triton" else f"wg8a8={self.lib is not None}"
        w = self.weight_q
        bits = "" if not isinstance(w, PackedGrouped) or not w.nibbles else ", 5 bits" if w.fifth is not None else ", nibbles"
        return (f"in={self.in_features}, out={self.out_features}, group={w.group}, "
                f"zeros={w.zeros is not None}, {kernel}{bits}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.weight_q, PackedGrouped):  # (not by GroupedColumns: use_interpreter() reloads its module)
            return self._forward_triton(x, self.weight_q)
        rows = x.reshape(-1, self.in_features).float().contiguous()
        if self.lib is None:
            y = F.linear(rows, self.weight_q.dequantized())
        else:
            out = None if self.kept_output is None else self.kept_output.rows(rows.shape[0], self.weight_q.padded)
            y = wg8a8_linear(self.lib, rows, self.weight_q, out)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _forward_triton(self, x: torch.Tensor, w: GroupedColumns) -> torch.Tensor:
        from kernels.triton.gguf_gemm import gguf_gemm  # looked up per call: kernels.use_interpreter() may reload it

        rows = x.reshape(-1, self.in_features)
        rows = rows if rows.dtype in (torch.float16, torch.bfloat16, torch.float32) else rows.float()
        y = gguf_gemm(rows if rows.stride(-1) == 1 else rows.contiguous(), w.qt, w.scales_t, w.zeros_t)
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        return self.weight_q.dequantized()

    def weight_bytes(self) -> int:
        return self.weight_q.nbytes()


class GgufEmbedding(nn.Module):
    def __init__(self, weight: Grouped) -> None:
        super().__init__()
        self.weight_q = weight
        self.num_embeddings, self.embedding_dim = weight.shape
        self.register_buffer("dtype_of", torch.empty(0), persistent=False)  # `model.to(dtype)` sets the output's dtype

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, group={self.weight_q.group}"

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        rows = self.weight_q.rows(flat).view(*ids.shape, self.embedding_dim)
        return rows.to(device=self.dtype_of.device, dtype=self.dtype_of.dtype)

    def weight_bytes(self) -> int:
        return self.weight_q.nbytes()
