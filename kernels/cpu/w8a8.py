"""W8A8 GEMM on CPUs: the C kernel in w8a8.c (x86 AVX2 + FMA; w8a8_avx512.c with AVX-512 VNNI, w8a8_neon.c on aarch64
with the dot-product instructions), for the INT4 models' lm_head and the embedder's int8 encoder.

    lib = load_w8a8(build_dir)                  # None where it cannot run (kernels/cpu/build.py says why)
    w = pack_w8a8(weight)                       # once: int8 rows, one scale per output row (symmetric)
    y = w8a8_linear(lib, x, w)                  # x (M, K) float32 -> (M, N) float32
    y = w8a8_linear(lib, x, w, bias, gelu=True) # gelu(x @ w.T + bias), the epilogue fused
    y_ref = w8a8_linear_ref(x, w, bias, gelu)   # the same arithmetic in torch (tests)

Each row of x is quantized to int8 per group of 64 values (32 where K is not a multiple of 64), the int8 x int8
products are summed exactly in integers per group, scaled by x's group scale into fp32, and by the weight row's
scale once at the end; then the bias is added and GELU (erf form, ~2e-7 relative: kernels/cpu/simd.h) applied while
the values are in L1. A row's result is independent of the other rows of the call.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.cpu.build import NEON_ISA, cpu_isa, load_c_kernel
from kernels.cpu.w4a8 import quantize_rows_ref

SOURCE = Path(__file__).with_suffix(".c")
SOURCE_AVX512 = Path(__file__).with_name("w8a8_avx512.c")  # the same entry point on AVX-512 + VNNI
SOURCE_NEON = Path(__file__).with_name("w8a8_neon.c")  # the same entry point on aarch64 NEON + dot product
SOURCES = {"avx2": SOURCE, "avx512": SOURCE_AVX512, NEON_ISA: SOURCE_NEON}  # by build.cpu_isa()


@dataclass(frozen=True)
class W8A8Weight:
    q: torch.Tensor  # (N, K) int8; with `octets` its bytes in w8a8_octets.h's order (N / 8, K / 4, 8, 4)
    scales: torch.Tensor  # (N,) float32: w = q * scale
    group_size: int  # of the activations' quantization
    octets: bool = False  # the layout of w8a8_octets.h (the lm_head's, on x86): w8a8_octets_linear, no bias or GELU
    args: tuple[int, int] = field(init=False)  # the kernel's pointer arguments, looked up once

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", (self.q.data_ptr(), self.scales.data_ptr()))

    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * 4


def w8a8_group(k: int) -> int:
    """The activation group size for K input features (0: the kernel cannot take K)."""
    return 64 if k % 64 == 0 else 32 if k % 32 == 0 else 0


def pack_w8a8(weight: torch.Tensor, octets: bool = False) -> W8A8Weight:
    """(N, K) float weight -> int8 rows with one scale per row (max |w| / 127); octets: in w8a8_octets.h's order
    (N a multiple of 8), for w8a8_octets_linear (`has_octets`)."""
    n, k = weight.shape
    group = w8a8_group(k)
    assert group, f"in_features {k} must be a multiple of 32"
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127
    q = (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8)
    if octets:
        assert n % 8 == 0, f"out_features {n}: a multiple of 8 (the kernel's octets of weight rows)"
        q = q.view(n // 8, 8, k // 4, 4).transpose(1, 2).reshape(n, k)
    return W8A8Weight(q.contiguous(), scale.contiguous(), group, octets)


def unpack_w8a8(w: W8A8Weight) -> torch.Tensor:
    """(N, K) int8 rows out of either layout."""
    n, k = w.q.shape
    return w.q.view(n // 8, k // 4, 8, 4).transpose(1, 2).reshape(n, k) if w.octets else w.q


def has_octets(lib: ctypes.CDLL | None) -> bool:
    """Whether the kernel serves the octets layout (x86: w8a8.c, w8a8_avx512.c; not w8a8_neon.c)."""
    return lib is not None and hasattr(lib, "w8a8_octets_linear")


def load_w8a8(build_dir: Path, isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot run. isa: "avx2" (w8a8.c), "avx512" (w8a8_avx512.c) or
    "neon-dotprod" (w8a8_neon.c, aarch64); by default the best this CPU runs (build.cpu_isa)."""
    lib = load_c_kernel(SOURCES[isa or cpu_isa()], Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.w8a8_linear.argtypes = [p, i64, p, p, p, ctypes.c_int, i64, i64, i64, i64, p, ctypes.c_int]
        lib.w8a8_linear.restype = ctypes.c_int
        if has_octets(lib):
            lib.w8a8_octets_linear.argtypes = [p, i64, p, p, i64, i64, i64, i64, p, ctypes.c_int]
            lib.w8a8_octets_linear.restype = ctypes.c_int
    return lib


def w8a8_linear(
    lib: ctypes.CDLL, x: torch.Tensor, w: W8A8Weight, bias: torch.Tensor | None = None, *, gelu: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x @ (q * scale).T (+ bias, then GELU if `gelu`) with x quantized per (row, group) to int8; x (M, K)
    float32 -> (M, N) float32; bias (N,) float32, contiguous. out: where to write y, (M, N) float32 contiguous
    (default: a new tensor)."""
    n, k = w.q.shape
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, f"x must be (M, {k}) with unit column stride"
    assert x.dtype == torch.float32 and x.device.type == "cpu", "x must be a float32 CPU tensor"
    assert bias is None or (bias.shape == (n,) and bias.dtype == torch.float32 and bias.is_contiguous()), "bias: (N,) fp32"
    m = x.shape[0]
    y = torch.empty(m, n) if out is None else out
    assert y.shape == (m, n) and y.dtype == torch.float32 and y.is_contiguous(), f"out must be ({m}, {n}) float32"
    if w.octets:
        assert bias is None and not gelu, "the octets layout has no epilogue"
        if lib.w8a8_octets_linear(x.data_ptr(), x.stride(0), *w.args, m, n, k, w.group_size, y.data_ptr(),
                                  torch.get_num_threads()):
            raise MemoryError(f"w8a8_octets_linear: no memory for the quantized activations ({m} x {k})")
        return y
    b = bias.data_ptr() if bias is not None else None
    if lib.w8a8_linear(
        x.data_ptr(), x.stride(0), *w.args, b, int(gelu), m, n, k, w.group_size, y.data_ptr(), torch.get_num_threads()
    ):
        raise MemoryError(f"w8a8_linear: no memory for the quantized activations ({m} x {k})")
    return y


def w8a8_linear_ref(x: torch.Tensor, w: W8A8Weight, bias: torch.Tensor | None = None, gelu: bool = False) -> torch.Tensor:
    """The kernel's arithmetic in torch (float64 throughout: accumulation, bias and an exact-erf GELU)."""
    n = w.q.shape[0]
    xq, xd, _ = quantize_rows_ref(x, w.group_size)
    q = unpack_w8a8(w).double().view(n, -1, w.group_size)
    dots = torch.einsum("mgk,ngk->mng", xq.double().view(x.shape[0], -1, w.group_size), q)
    y = (dots * xd.double()[:, None]).sum(-1) * w.scales.double()
    y = y if bias is None else y + bias.double()
    return (gelu_ref(y) if gelu else y).float()


def gelu_ref(y: torch.Tensor) -> torch.Tensor:
    """GELU's erf form in float64 as 0.5 y erfc(-y / sqrt 2): F.gelu's 1 + erf(y / sqrt 2) cancels to 0 below y ~ -8."""
    y = y.double()
    return 0.5 * y * torch.erfc(-y / math.sqrt(2))  # torch.special.erfc's alias; this name carries a type
