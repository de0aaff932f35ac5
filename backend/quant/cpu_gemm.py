"""Dense CPU GEMM with the weight prepacked once for oneDNN (AMX / AVX-512 BF16 on current Xeons).

`F.linear` hands oneDNN a plain (out, in) weight, which it re-lays out into its blocked format on every
call; the engine multiplies by the same weights thousands of times, so we reorder once at load time and
call oneDNN's linear on the blocked copy (the op torch's own inductor emits for frozen CPU linears).
Measured on this machine's Xeon (2 threads, bf16; `bench/README.md`, "Prepacked GEMM"): 1.3-1.7x faster
than F.linear from 1 to 64 rows, results bit-identical. Where oneDNN is missing (or on CUDA) it is F.linear.

    w = PackedLinear(weight_bf16)     # once
    y = w(x_bf16)                     # (..., in) -> (..., out), x in the weight's dtype
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu.small_gemm import MAX_ROWS as SMALL_GEMM_ROWS
from kernels.cpu.small_gemm import small_gemm
from kernels.cpu.small_gemm import supports as small_gemm_supports
from kernels.cpu.w8a8 import pack_w8a8, w8a8_linear


def onednn_available(dtype: torch.dtype) -> bool:
    """Whether torch was built with oneDNN and this CPU runs it for `dtype`."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype != torch.bfloat16 or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def dense_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype dense copies of low-bit weights are kept and multiplied in: bfloat16 on CUDA and on CPUs where
    oneDNN runs bf16 natively (AVX-512 BF16 / AMX: 2-3x fp32), float32 elsewhere. An AVX2-only CPU has no bf16
    arithmetic: its bf16 GEMM was 6x slower than a prepacked fp32 one at 32 rows (bench/README, "AVX2 CPUs")."""
    if torch.device(device).type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if onednn_available(torch.bfloat16) else torch.float32


class PackedLinear:
    """y = x @ W.T (+ b) with W blocked for oneDNN. Not an nn.Module: it holds no trainable state."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        self.bias = None if bias is None else bias.detach().to(weight.dtype)
        w = weight.detach().contiguous()
        self.packed = w.device.type == "cpu" and onednn_available(w.dtype)
        # The blocked copy replaces the plain one (same bytes), so keeping it costs no memory.
        self.weight = torch.ops.mkldnn._reorder_linear_weight(w) if self.packed else w

    def __call__(self, x: torch.Tensor, activation: str = "none") -> torch.Tensor:
        """`activation`: "none" or "gelu" (erf GELU, fused into the GEMM's epilogue by oneDNN)."""
        if self.packed:
            algorithm = "none" if activation == "gelu" else ""  # GELU's "none" approximation is the exact (erf) one
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, activation, [], algorithm)
        y = F.linear(x, self.weight, self.bias)
        return F.gelu(y) if activation == "gelu" else y

    def nbytes(self) -> int:
        return self.out_features * self.in_features * self.dtype.itemsize


def half_weight_gemm_available() -> bool:
    """Whether torch has FBGEMM's fp16-weight GEMM (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


class HalfWeightLinear:
    """y = x @ W.T (+ b) with W stored in fp16 and the arithmetic in fp32 (FBGEMM's fp16-weight GEMM, prepacked).

    For few-row calls whose cost is reading the weights, on CPUs without native bf16: half the bytes of fp32
    and the same activations. all-MiniLM-L6-v2 on an AMD EPYC (AVX2), a 10-token query: 7.9 ms against 9.5 ms
    with prepacked fp32, cosine to the fp32 vectors 0.9999999 (bench/README, "AVX2 CPUs"). From ~32 rows on
    it is slower than prepacked fp32, so it is not used for the engine's batches."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = torch.float32  # what it takes and returns
        b = None if bias is None else bias.detach().float()
        self.params = torch.ops.quantized.linear_prepack_fp16(weight.detach().float().contiguous(), b)

    def __call__(self, x: torch.Tensor, activation: str = "none") -> torch.Tensor:
        """`activation`: "none" or "gelu" (erf GELU)."""
        y = torch.ops.quantized.linear_dynamic_fp16(x, self.params)
        return F.gelu(y) if activation == "gelu" else y

    def nbytes(self) -> int:
        return self.out_features * self.in_features * 2


class Int8ActLinear:
    """y = x @ W.T (+ b) with W in int8 rows (one scale each) and x quantized per row and group of 64 to int8: the
    W8A8 C kernel (kernels/cpu/w8a8.c, x86 AVX2). A quarter of fp32's weight bytes, integer SIMD products; for the
    embedder's short queries, whose cost is reading the weights. The bias and GELU run in the kernel's epilogue (as
    torch ops they and the LayerNorms were ~10% of an int8 embedding of one query: bench/README "cache")."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, lib: ctypes.CDLL) -> None:
        self.out_features, self.in_features = weight.shape
        self.dtype = torch.float32  # what it takes and returns
        self.lib, self.weight = lib, pack_w8a8(weight.detach())
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def __call__(self, x: torch.Tensor, activation: str = "none") -> torch.Tensor:
        """`activation`: "none" or "gelu" (erf GELU)."""
        rows = x.reshape(-1, self.in_features).contiguous()
        y = w8a8_linear(self.lib, rows, self.weight, self.bias, gelu=activation == "gelu")
        return y.view(*x.shape[:-1], self.out_features)

    def nbytes(self) -> int:
        return self.weight.nbytes()


def mkl_gemv_wins() -> bool:
    """Whether MKL's single-row GEMV on a plain weight beats oneDNN's packed GEMM: on Intel CPUs (measured on a
    Xeon). MKL takes a generic path on other vendors' CPUs: on an AMD EPYC (AVX2) a 3072x576 fp32 GEMV took
    0.65 ms against 0.38 packed, the 49152x576 lm_head 11.5 ms against 7.0 (bench/README, "AVX2 CPUs")."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("vendor_id") and "GenuineIntel" in line for line in f)
    except OSError:
        return False


class DualLinear(nn.Module):
    """A full-precision linear on CPU holding its plain weight and a oneDNN-prepacked copy of it.

    Single-row calls (decode of one sequence) run MKL's GEMV on the plain weight on Intel CPUs, where the packed
    GEMM does not beat it (elsewhere they run the packed copy too: `mkl_gemv_wins`); calls with more rows
    (prefill, batched decode, a speculative verify of 1 + k tokens) run the packed copy: measured 1.15x at 32
    streams and ~2x for the lm_head at 5 rows (bench/README, "Prepacked GEMM"). The price is a second copy of
    the weights; `EngineConfig.packed_copy` turns it off. With `small_gemm` (the C kernel kernels/cpu/small_gemm.c,
    x86 AVX2) calls of up to 16 rows run it on the plain weight instead: it reads each weight once for all rows, so
    a verify of 1 + k tokens costs about one plain step (oneDNN: 1.4x), and a row's result is the same at any M.
    `row_invariant` (EngineConfig.deterministic): every call runs that kernel, 16 rows at a time, so a row's result
    never depends on the call's row count (oneDNN's blocking does: docs/determinism.md)."""

    def __init__(
        self, linear: nn.Linear, min_rows: int = 2, small_gemm: ctypes.CDLL | None = None, row_invariant: bool = False
    ) -> None:
        super().__init__()
        self.min_rows = min_rows  # calls with fewer rows use the plain weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same Parameters (a tied lm_head stays tied)
        self.packed = PackedLinear(linear.weight, linear.bias)
        fits = small_gemm is not None and small_gemm_supports(linear.weight)
        self.small_gemm = small_gemm if fits and (linear.bias is None or linear.bias.dtype == torch.float32) else None
        self.row_invariant = row_invariant and self.small_gemm is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.row_invariant and rows > SMALL_GEMM_ROWS and x.dtype == torch.float32:
            flat = _unit_stride_rows(x.reshape(rows, self.in_features))
            parts = [small_gemm(self.small_gemm, flat[i : i + SMALL_GEMM_ROWS], self.weight, self.bias)
                     for i in range(0, rows, SMALL_GEMM_ROWS)]
            return torch.cat(parts).view(*x.shape[:-1], self.out_features)
        if self.small_gemm is not None and 0 < rows <= SMALL_GEMM_ROWS and x.dtype == torch.float32:
            y = small_gemm(self.small_gemm, _unit_stride_rows(x.reshape(rows, self.in_features)), self.weight, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        if rows >= self.min_rows:
            return self.packed(x)
        return F.linear(x, self.weight, self.bias)


def _unit_stride_rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def add_packed_copies(model: nn.Module, small_gemm: ctypes.CDLL | None = None, row_invariant: bool = False) -> int:
    """Swap every full-precision CPU nn.Linear in `model` for a DualLinear (`small_gemm`: the C kernel for calls of
    up to 16 rows, `row_invariant`: for every call, see DualLinear); returns the bytes added."""
    added, min_rows = 0, 2 if mkl_gemv_wins() else 1
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear and child.weight.device.type == "cpu" and child.weight.is_floating_point():
                dual = DualLinear(child, min_rows, small_gemm, row_invariant)
                if dual.packed.packed:
                    setattr(module, name, dual)
                    added += dual.packed.nbytes()
    return added
