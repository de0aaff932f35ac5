"""Grouped W8A8 GEMM on x86 CPUs: the C kernel in wg8a8.c, for a GGUF file's blocks served in their own values.

    lib = load_wg8a8(build_dir)               # None where it cannot run (no C kernels, or not x86): use the reference
    w = GroupedInt8(q, scales, zeros)         # q (N, K) int8; scales (N, K/16 or K/32) fp32; zeros (N, K/32) or None
    y = wg8a8_linear(lib, x, w)               # x (M, K) float32 -> (M, N) float32
    w.dequantized()                           # the float32 weights served: scales * q (+ zeros), per group

Each row of x is quantized to int8 per group of 32 values (kernels/cpu/quantize.h), the products summed exactly in
integers per 32-value block, scaled per lane by the weight's group scale and x's, and the zero terms added from x's
exact group sums. A row's result does not depend on the other rows of the call.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.cpu.build import is_arm, load_c_kernel
from kernels.cpu.w4a8 import quantize_rows_ref

SOURCE = Path(__file__).with_suffix(".c")
ACT_GROUP = 32  # x's quantization group, and the zero terms' group


@dataclass(frozen=True)
class GroupedInt8:
    q: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N, K / group) float32
    zeros: torch.Tensor | None  # (N, K / 32) float32, added per group; None: symmetric
    group: int = field(init=False)
    args: tuple[int, int, int | None] = field(init=False)  # the kernel's pointer arguments, looked up once

    def __post_init__(self) -> None:
        n, k = self.q.shape
        assert self.q.dtype == torch.int8 and k % ACT_GROUP == 0, f"q must be int8 (N, K) with K % 32 == 0, got {k}"
        assert self.scales.dtype == torch.float32 and self.scales.shape[0] == n, "scales: (N, K / G) float32"
        group = k // self.scales.shape[1]
        assert group in (16, 32) and group * self.scales.shape[1] == k, f"group size {group}: 16 or 32"
        assert self.zeros is None or (self.zeros.shape == (n, k // ACT_GROUP) and self.zeros.dtype == torch.float32)
        object.__setattr__(self, "group", group)
        zeros = None if self.zeros is None else self.zeros.data_ptr()
        object.__setattr__(self, "args", (self.q.data_ptr(), self.scales.data_ptr(), zeros))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)  # type: ignore[return-value]

    def nbytes(self) -> int:
        return self.q.numel() + 4 * (self.scales.numel() + (0 if self.zeros is None else self.zeros.numel()))

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The served float32 weights (all rows, or those indexed by `rows`): scale * q, then + zero, in float32, the
        two operations of gguf-py's reference in the same order (so bit-identical to it: tests/test_gguf_types.py)."""
        q, s, z = (self.q, self.scales, self.zeros) if rows is None else (
            self.q[rows], self.scales[rows], None if self.zeros is None else self.zeros[rows])
        n, k = q.shape
        w = s[..., None] * q.float().view(n, -1, self.group)
        if z is not None:
            w = w.view(n, -1, ACT_GROUP) + z[..., None]
        return w.reshape(n, k)


def load_wg8a8(build_dir: Path) -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot run (no C kernels here, or an aarch64 CPU: x86 only for now)."""
    if is_arm():
        return None
    lib = load_c_kernel(SOURCE, Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.wg8a8_linear.argtypes = [p, i64, p, p, p, i64, i64, i64, i64, p, ctypes.c_int]
        lib.wg8a8_linear.restype = ctypes.c_int
    return lib


def wg8a8_linear(lib: ctypes.CDLL, x: torch.Tensor, w: GroupedInt8) -> torch.Tensor:
    """y = x @ w.dequantized().T with x quantized per (row, group of 32) to int8; x (M, K) float32 -> (M, N) float32."""
    n, k = w.q.shape
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, f"x must be (M, {k}) with unit column stride"
    assert x.dtype == torch.float32 and x.device.type == "cpu", "x must be a float32 CPU tensor"
    m = x.shape[0]
    y = torch.empty(m, n)
    rc = lib.wg8a8_linear(x.data_ptr(), x.stride(0), *w.args, m, n, k, w.group, y.data_ptr(), torch.get_num_threads())
    if rc:
        raise MemoryError(f"wg8a8_linear: no memory for the quantized activations ({m} x {k})") if rc == -1 else \
            ValueError(f"wg8a8_linear: shape ({n}, {k}) group {w.group} not taken")
    return y


def wg8a8_linear_ref(x: torch.Tensor, w: GroupedInt8) -> torch.Tensor:
    """The kernel's arithmetic in torch, float64 throughout (the integer dot products exact)."""
    n, _k = w.q.shape
    m = x.shape[0]
    xq, xd, xs = quantize_rows_ref(x, ACT_GROUP)
    dots = torch.einsum("mgk,ngk->mng", xq.double().view(m, -1, w.group), w.q.double().view(n, -1, w.group))
    xd_per_group = xd.double().repeat_interleave(ACT_GROUP // w.group, dim=1)  # x's scale for each weight group
    y = (dots * xd_per_group[:, None] * w.scales.double()).sum(-1)
    if w.zeros is not None:
        y = y + xs.double() @ w.zeros.double().T
    return y.float()
