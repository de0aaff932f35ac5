"""fp32 GEMM for 1..16 rows of x on x86 CPUs (AVX2 + FMA): the C kernel in small_gemm.c.

    lib = load_small_gemm(build_dir)            # None where it cannot run (kernels/cpu/build.py says why)
    y = small_gemm(lib, x, weight, bias)        # x (M <= 16, K) float32, weight (N, K) -> (M, N) float32
    y_ref = small_gemm_ref(x, weight, bias)     # float64 reference (tests)

For full-precision decode steps and speculative verifies (a few rows against every weight once): each weight row
is read once for all rows of x, so 5 rows cost about what 1 does (oneDNN's packed GEMM: 1.4x). A row's result does
not depend on the other rows of the call.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from kernels.cpu.build import load_c_kernel

SOURCE = Path(__file__).with_suffix(".c")
MAX_ROWS = 16  # the kernel's register tiles: 1..8 rows of x, then a second pass for 9..16


def load_small_gemm(build_dir: Path) -> ctypes.CDLL | None:
    lib = load_c_kernel(SOURCE, Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.small_gemm.argtypes = [p, i64, p, p, i64, i64, i64, p, ctypes.c_int]
        lib.small_gemm.restype = ctypes.c_int
    return lib


def supports(weight: torch.Tensor) -> bool:
    """Whether the kernel takes this weight (float32 CPU, contiguous, in_features a multiple of 8)."""
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.dim() == 2
            and weight.is_contiguous() and weight.shape[1] % 8 == 0)


def small_gemm(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T (+ bias); x (M, K) float32 with 1 <= M <= 16 and unit column stride -> (M, N)."""
    m, k = x.shape
    n = weight.shape[0]
    assert supports(weight) and weight.shape[1] == k, f"weight must be float32 (N, {k}) contiguous, K % 8 == 0"
    assert 1 <= m <= MAX_ROWS and x.dtype == torch.float32 and x.stride(1) == 1, f"x must be (1..{MAX_ROWS}, K) float32"
    assert bias is None or (bias.shape == (n,) and bias.dtype == torch.float32 and bias.is_contiguous())
    y = torch.empty(m, n)
    lib.small_gemm(x.data_ptr(), x.stride(0), weight.data_ptr(), None if bias is None else bias.data_ptr(), m, n, k,
                   y.data_ptr(), torch.get_num_threads())
    return y


def small_gemm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    y = x.double() @ weight.double().T
    return (y if bias is None else y + bias.double()).float()
