"""Grouped W8A8 GEMM on CPUs: the C kernel in wg8a8.c (AVX2), wg8a8_avx512.c (VNNI), wg8a8_neon.c (aarch64), for a
GGUF file's blocks served in their own values (backend/quant/gguf_types.py decodes them).

    g = GroupedInt8(q, scales, zeros)         # q (N, K) int8; scales (N, K/16 or K/32) fp32; zeros (N, K/32) or None
    lib = load_wg8a8(build_dir)               # None where it cannot run (no C compiler: torch on the values instead)
    w = pack(g, lanes_of(lib))                # once: the kernel's layout, the only copy a layer keeps
    w = pack(g, lanes_of(lib), nibbles=True, offset=o)  # or, for q + o in 0..15 (groups of 32), two values a byte
                                              # (wg4a8_linear)
    w = pack(g, lanes_of(lib), nibbles=True, offset=o, fifth=True)  # or, for q + o in 0..31 (groups of 32):
                                              # the low four bits so, and a plane of fifth bits (wg5a8_linear)
    y = wg8a8_linear(lib, x, w)               # x (M, K) float32 -> (M, N) float32
    w.rows(ids), w.dequantized()              # the float32 weights served: scale * q (+ zero), per group

Each row of x is quantized to int8 per group of 32 values (kernels/cpu/quantize.h), the products summed exactly in
integers per weight group, scaled by the group's eight rows' scales times x's, and the terms added from x's exact sums
(wg8a8_octets.h). A row's result does not depend on the other rows of the call.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kernels.cpu.build import NEON_ISA, cpu_isa, load_c_kernel
from kernels.cpu.w4a8 import quantize_rows_ref

SOURCES = {"avx2": Path(__file__).with_suffix(".c"), "avx512": Path(__file__).with_name("wg8a8_avx512.c"),
           NEON_ISA: Path(__file__).with_name("wg8a8_neon.c")}  # by build.cpu_isa()
ACT_GROUP = 32  # x's quantization group, and the terms' group


def _dequantize(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    """float32 (n, K) = s * q (+ z) per group: gguf-py's two operations in its order (bit-identical to it)."""
    n, k = q.shape
    w = s[..., None] * q.float().view(n, s.shape[1], -1)
    if z is not None:
        w = w.view(n, z.shape[1], -1) + z[..., None]
    return w.reshape(n, k)


@dataclass(frozen=True)
class GroupedInt8:
    """A weight in rows: what a GGUF tensor decodes to (gguf_types.decode) and what the loader fuses."""

    q: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N, K / group) float32
    zeros: torch.Tensor | None  # (N, K / 32) float32, added per group; None: symmetric
    group: int = field(init=False)

    def __post_init__(self) -> None:
        n, k = self.q.shape
        assert self.q.dtype == torch.int8 and k % ACT_GROUP == 0, f"q must be int8 (N, K) with K % 32 == 0, got {k}"
        assert self.scales.dtype == torch.float32 and self.scales.shape[0] == n, "scales: (N, K / G) float32"
        group = k // self.scales.shape[1]
        assert group in (16, 32) and group * self.scales.shape[1] == k, f"group size {group}: 16 or 32"
        assert self.zeros is None or (self.zeros.shape == (n, k // ACT_GROUP) and self.zeros.dtype == torch.float32)
        object.__setattr__(self, "group", group)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.q.shape[0], self.q.shape[1])

    def dequantized(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is None:
            return _dequantize(self.q, self.scales, self.zeros)
        return _dequantize(self.q[rows], self.scales[rows], None if self.zeros is None else self.zeros[rows])


@dataclass(frozen=True)
class PackedGrouped:
    """The kernel's layout (wg8a8_octets.h): rows in chunks of L = `lanes` (8, octets; 16 for wg8a8_avx512.c), N
    padded to a multiple of L with zero rows."""

    q: torch.Tensor  # (N / L, K / 4, L, 4) int8, or with `nibbles` (N / L, K / 8, L, 4) uint8 (wg8a8_entry.h)
    scales: torch.Tensor  # (N / L, K / group, L) float32, or float16 where every scale is an fp16 value (Q8_0, Q5_0 ...)
    zeros: torch.Tensor | None  # (N / L, K / 32, L) float32
    n: int  # the rows that are real
    group: int
    nibbles: bool = False  # q holds u = value + offset (0..15; its low four bits with `fifth`), chunks t and t + 1 in one
    offset: int = 0  # with nibbles: value = u - offset
    # with nibbles, u's fifth bits (u in 0..31; q holds the low four), a bit a value, in the order its kernel spreads
    # fastest: with L 16 (AVX-512's masks) (N / L, K / 4, L / 2) uint8, per chunk of q's unpacked values (L x 4) bit i
    # of the chunk's bytes (little-endian) for its value i; with L 8 (AVX2, NEON: a shift) (N / L, K / 32, L x 4), per
    # group of 32 a byte per position in a chunk, bit c for the group's chunk c
    fifth: torch.Tensor | None = None
    args: tuple[int, int, int | None, int, int | None] = field(init=False)  # the kernel's weight arguments, looked up once

    def __post_init__(self) -> None:
        zeros = None if self.zeros is None else self.zeros.data_ptr()
        half = int(self.scales.dtype == torch.float16)
        fifth = None if self.fifth is None else self.fifth.data_ptr()
        object.__setattr__(self, "args", (self.q.data_ptr(), self.scales.data_ptr(), zeros, half, fifth))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.q.shape[1] * (8 if self.nibbles else 4))

    @property
    def lanes(self) -> int:
        return self.q.shape[2]

    @property
    def padded(self) -> int:
        """The rows with the last chunk's padding: the width of the kernel's output."""
        return self.q.shape[0] * self.lanes

    def nbytes(self) -> int:
        terms = 0 if self.zeros is None else 4 * self.zeros.numel()
        fifth = 0 if self.fifth is None else self.fifth.numel()
        return self.q.numel() + self.scales.numel() * self.scales.element_size() + terms + fifth

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 (len(ids), K): the served values of those rows (an embedding lookup: no float copy of the table)."""
        chunk, lane = ids // self.lanes, ids % self.lanes
        q = self.q[chunk, :, lane, :]  # (rows, K / 4, 4), or (rows, K / 8, 4) nibble pairs
        if self.nibbles:
            u = torch.stack([q & 15, q >> 4], dim=2).to(torch.int16)  # (rows, K / 8, 2: chunks t and t + 1, 4)
            if self.fifth is not None:  # -> (rows, K / 4 chunks, lanes x 4 bits) -> this lane's 4 bits of each chunk
                plane, bit = self.fifth[chunk].to(torch.int16), torch.arange(8)
                bits = (plane[:, :, None] >> bit[:, None] if self.lanes == 8 else plane[..., None] >> bit) & 1
                bits = bits.reshape(len(ids), -1, self.lanes, 4)[torch.arange(len(ids)), :, lane]
                u = u + 16 * bits.reshape(u.shape)
            q = (u - self.offset).to(torch.int8)
        q = q.reshape(len(ids), -1)
        z = None if self.zeros is None else self.zeros[chunk, :, lane]
        return _dequantize(q, self.scales[chunk, :, lane].float(), z)

    def dequantized(self) -> torch.Tensor:
        return self.rows(torch.arange(self.n))


def pack(g: GroupedInt8, lanes: int = 8, nibbles: bool = False, offset: int = 0, *, fifth: bool = False) -> PackedGrouped:
    """g in the layout of a kernel whose chunks hold `lanes` rows (lanes_of(lib): 8, or 16 for wg8a8_avx512.c); with
    `nibbles`, its values as u = q + offset (0..15, groups of 32) two a byte: chunk t's in the low nibbles, t + 1's in
    the high ones; with `fifth` too, u in 0..31 (groups of 32), its low four bits so and its fifth bits in
    a plane of their own."""
    assert lanes in (8, 16), f"lanes: 8 or 16, got {lanes}"
    assert offset == 0 or nibbles, "an offset is the nibble layout's"
    assert not fifth or nibbles, "the 5-bit layout is the nibble layout's"
    if nibbles:
        top = 31 if fifth else 15
        low, high = int(g.q.min()) + offset, int(g.q.max()) + offset
        assert g.group == 32 and low >= 0 and high <= top, f"nibbles: q + offset in 0..{top}, group 32 (got {low}..{high})"
    n = g.shape[0]
    pad = -n % lanes

    def chunks(t: torch.Tensor, width: int) -> torch.Tensor:  # (N, C) -> (N / lanes, C / width, lanes, width)
        t = torch.cat([t, t.new_zeros(pad, t.shape[1])]) if pad else t
        return t.view(-1, lanes, t.shape[1] // width, width).transpose(1, 2).contiguous()

    zeros = None if g.zeros is None else chunks(g.zeros, 1).squeeze(-1)
    q = chunks(g.q, 4)
    bits = None
    if nibbles:  # (N / L, K / 4, L, 4) -> pairs of chunks (t, t + 1) -> one byte a pair of values
        u = (q.to(torch.int16) + offset).to(torch.uint8)  # the padding rows too: value 0
        if fifth:
            fifths, bit = (u >> 4).to(torch.int16), torch.arange(8, dtype=torch.int16)
            if lanes == 8:  # a group's 8 chunks -> L x 4 bytes: bit c of byte i for value i of chunk c
                planes = (fifths.view(u.shape[0], -1, 8, lanes * 4) << bit[:, None]).sum(2)
            else:  # each chunk's L x 4 fifth bits, little-endian: bit i of the chunk's bytes for its value i
                planes = (fifths.view(u.shape[0], u.shape[1], -1, 8) << bit).sum(-1)
            bits, u = planes.to(torch.uint8).contiguous(), u & 15
        pairs = u.view(q.shape[0], -1, 2, lanes, 4)
        q = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).contiguous()
    scales = chunks(g.scales, 1).squeeze(-1)
    if torch.equal(scales.half().float(), scales):  # a GGUF type's own fp16 d (Q8_0, Q5_0, Q4_0, ...): half the bytes
        scales = scales.half()
    return PackedGrouped(q, scales, zeros, n, g.group, nibbles, offset, bits)


def lanes_of(lib: ctypes.CDLL | None) -> int:
    """The rows a chunk of `lib`'s weight layout holds (8 without a kernel: torch reads any layout)."""
    return 8 if lib is None else int(lib.wg8a8_lanes())


def load_wg8a8(build_dir: Path, isa: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot run (kernels/cpu/build.py says why). isa: "avx2" (wg8a8.c),
    "avx512" (wg8a8_avx512.c, VNNI) or "neon-dotprod" (wg8a8_neon.c); by default the best this CPU runs (cpu_isa)."""
    lib = load_c_kernel(SOURCES[isa or cpu_isa()], Path(build_dir))
    if lib is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        lib.wg8a8_linear.argtypes = [p, i64, p, p, p, i64, i64, i64, i64, ctypes.c_int, p, ctypes.c_int]
        lib.wg4a8_linear.argtypes = [p, i64, p, p, p, i64, i64, i64, i64, ctypes.c_int, ctypes.c_int32, p, ctypes.c_int]
        lib.wg5a8_linear.argtypes = [p, i64, p, p, p, p, i64, i64, i64, i64, ctypes.c_int, ctypes.c_int32, p,
                                     ctypes.c_int]
        for entry in (lib.wg8a8_linear, lib.wg4a8_linear, lib.wg5a8_linear):
            entry.restype = ctypes.c_int
        lib.wg8a8_lanes.argtypes, lib.wg8a8_lanes.restype = [], ctypes.c_int
    return lib


def wg8a8_linear(lib: ctypes.CDLL, x: torch.Tensor, w: PackedGrouped, out: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w.dequantized().T with x quantized per (row, group of 32) to int8; x (M, K) float32 -> (M, N) float32.
    out: where to write y, (M, N rounded up to w.lanes) float32 contiguous (default: a new tensor)."""
    padded, k = w.padded, w.shape[1]
    assert w.lanes == lanes_of(lib), f"w is packed in chunks of {w.lanes} rows; this kernel reads {lanes_of(lib)}"
    assert x.dim() == 2 and x.shape[1] == k and x.stride(1) == 1, f"x must be (M, {k}) with unit column stride"
    assert x.dtype == torch.float32 and x.device.type == "cpu", "x must be a float32 CPU tensor"
    m = x.shape[0]
    y = torch.empty(m, padded) if out is None else out
    assert y.shape == (m, padded) and y.dtype == torch.float32 and y.is_contiguous(), f"out must be ({m}, {padded}) float32"
    q, scales, zeros, half, fifth = w.args
    if fifth is not None:
        rc = lib.wg5a8_linear(x.data_ptr(), x.stride(0), q, fifth, scales, zeros, m, padded, k, w.group, half, w.offset,
                              y.data_ptr(), torch.get_num_threads())
    elif w.nibbles:
        rc = lib.wg4a8_linear(x.data_ptr(), x.stride(0), q, scales, zeros, m, padded, k, w.group, half, w.offset,
                              y.data_ptr(), torch.get_num_threads())
    else:
        rc = lib.wg8a8_linear(x.data_ptr(), x.stride(0), q, scales, zeros, m, padded, k, w.group, half, y.data_ptr(),
                              torch.get_num_threads())
    if rc:
        raise MemoryError(f"wg8a8_linear: no memory for the quantized activations ({m} x {k})") if rc == -1 else \
            ValueError(f"wg8a8_linear: shape ({padded}, {k}) group {w.group} not taken")
    return y if padded == w.n else y[:, : w.n].contiguous()


def wg8a8_linear_ref(x: torch.Tensor, w: GroupedInt8) -> torch.Tensor:
    """The kernel's arithmetic in torch, float64 throughout (the integer dot products exact)."""
    n, m = w.q.shape[0], x.shape[0]
    xq, xd, xs = quantize_rows_ref(x, ACT_GROUP)
    dots = torch.einsum("mgk,ngk->mng", xq.double().view(m, -1, w.group), w.q.double().view(n, -1, w.group))
    xd_per_group = xd.double().repeat_interleave(ACT_GROUP // w.group, dim=1)  # x's scale for each weight group
    y = (dots * xd_per_group[:, None] * w.scales.double()).sum(-1)
    if w.zeros is not None:
        y = y + xs.double() @ w.zeros.double().T
    return y.float()
