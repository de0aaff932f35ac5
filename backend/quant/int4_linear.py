"""Int4Linear: y = x @ W.T + b with W held as 4-bit integers (W4A16), the engine's layer for AWQ checkpoints.

It is built on the meta device with AWQ's tensors (qweight / qzeros / scales, see awq_format.py), filled by
the loader, then `prepare()` runs once on the final device:

- CPU: repack into torch's int4 layout for `_weight_int4pack_mm_for_cpu` (bf16 activations, a (scale,
  zero) pair per group). That kernel dequantizes its weight tile again for every 4 rows of x, so it wins
  for decode (few rows: it reads a quarter of the bf16 bytes) but loses for batches. With `dense_copy`
  (the default) prepare() also keeps the dequantized weight and calls with at least DENSE_COPY_ROWS rows
  run a dense GEMM on it: 2x faster than the int4 kernel at 32 rows. The copy is bf16 where the CPU
  multiplies bf16 natively (AVX-512 BF16 / AMX; 2 more bytes per weight) and float32 on AVX2-only CPUs,
  whose bf16 GEMM is 6x slower than fp32 (`cpu_gemm.dense_dtype`). Without the copy, calls with at least
  DENSE_ROWS rows dequantize the whole weight on the fly (only worth it for prefill-sized calls).
- CPU with the W4A8 kernel (kernels/cpu/w4a8.c, x86 AVX2 + a C compiler; `prepare(w4a8=lib)`): every call
  quantizes x per row and group to int8 and multiplies on integer SIMD against the 4-bit weight, which is then the
  only copy. On an AMD EPYC (AVX2) a 3072x576 layer: 0.07-0.14 ms at 1 row (torch's int4 kernel 0.15, fp32
  0.38-0.57), 1.5x faster than the prepacked fp32 copy at 32 rows, as fast at 256 (bench/README, "W4A8").
- CUDA: keep the AWQ layout and call the Triton W4A16 GEMM (kernels/triton/awq_gemm.py).

torch's layout stores w = (q - 8) * scale + zero_f; AWQ's w = (q - z) * scale, so zero_f = (8 - z) * scale.
A layer built with `layout="gguf"` holds a GGUF file's Q4_0/Q4_1 blocks instead (gguf_blocks.py: groups of 32,
w = d q + m, so zero_f = 8 d + m), served as they are by the W4A8 kernel (its group-32 blocks layout: fp16 d and zero
term -m inline with the nibbles, no integer zero point) or
torch's int4 kernel (whose bf16 scale and zero round them); on CUDA the Triton W4A16 GEMM takes them with float zero
terms.
An act-order GPTQ layer (gptq_format.py) also carries `in_perm`: its weight's input channels are stored sorted
by group, so the input's columns are gathered in that order first.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import nn

from backend.quant.awq_format import QuantizedWeight, unpack
from backend.quant.cpu_gemm import PackedLinear, dense_dtype
from backend.quant.gguf_blocks import dequantize_blocks, unpack_q4
from kernels.cpu.w4a8 import GROUP_SIZES as W4A8_GROUP_SIZES
from kernels.cpu.w4a8 import pack_w4a8, pack_w4a8_blocks, w4a8_linear

DENSE_ROWS = 128  # from this many rows on, dequantize + dense GEMM beats the int4 kernel (measured ~96)
DENSE_COPY_ROWS = 10  # from this many rows on, a kept dense copy beats the int4 kernel (measured ~9 bf16 AMX, ~8 fp32 AVX2)
# torch's CPU int4 layouts: blocks of 64 output rows on AVX-512, 32 on AVX2; in a block of b rows, byte j holds
# rows j (low nibble) and j + b / 2 (high)
CPU_BLOCKS_N = (64, 32)


class Int4Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, group_size: int, bias: bool, *, layout: str = "awq") -> None:
        """layout "awq": AWQ's qweight / qzeros / scales (awq_format.py); "gguf": q4 / q4_scales / q4_mins, a GGUF
        file's Q4_0/Q4_1 blocks (gguf_blocks.py; group_size 32), the fp16 scales and minimums held as their int16
        bit patterns so that casting the model to another float dtype cannot round them."""
        super().__init__()
        if layout not in {"awq", "gguf"}:
            raise ValueError(f"unknown Int4Linear layout {layout!r}")
        self.in_features, self.out_features, self.group_size, self.layout = in_features, out_features, group_size, layout
        groups = in_features // group_size

        def frozen(*shape: int, dtype: torch.dtype) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        # Parameters (not buffers) so the loader's "anything left on the meta device?" check covers them.
        if layout == "gguf":
            self.q4 = frozen(out_features, in_features // 2, dtype=torch.uint8)
            self.q4_scales = frozen(out_features, groups, dtype=torch.int16)
            self.q4_mins = frozen(out_features, groups, dtype=torch.int16)
        else:
            self.qweight = frozen(in_features, out_features // 8, dtype=torch.int32)
            self.qzeros = frozen(groups, out_features // 8, dtype=torch.int32)
            self.scales = frozen(groups, out_features, dtype=torch.float16)
        self.bias = frozen(out_features, dtype=torch.float32) if bias else None
        self.register_buffer("in_perm", None)  # (in,) long, act-order GPTQ only (set by the loader)
        # after prepare(): "w4a8" / "int4pack" (CPU), "dense" (CPU fallback), "triton" (CUDA)
        self.mode = "awq"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, group={self.group_size}, mode={self.mode}"

    # ---- one-time repacking ---------------------------------------------------------------------
    def prepare(self, dense_copy: bool = True, w4a8: ctypes.CDLL | None = None) -> None:
        """Repack the loaded AWQ tensors for this device (once, at load time); `w4a8`: the built W4A8 kernel
        (CPU), which then serves every call; else `dense_copy`: also keep a dense copy for batched calls (CPU)."""
        first = self.q4 if self.layout == "gguf" else self.qweight
        if first.is_meta:
            raise ValueError("Int4Linear.prepare() before its 4-bit tensors were loaded")
        if self.layout == "gguf":
            self._prepare_gguf(dense_copy, w4a8)
            return
        if self.qweight.device.type == "cuda":
            self.scales.data = self.scales.data.half()
            self.mode = "triton"
            return
        qw = unpack(self.qweight.data, self.qzeros.data, self.scales.data.half())
        scale = qw.scales.float()  # (out, groups)
        del self.qweight, self.qzeros, self.scales  # the repacked copy replaces them
        if w4a8 is not None and self._w4a8_fits():
            self.w4a8, self.w4a8_lib, self.mode = pack_w4a8(qw.q, scale, qw.zeros.float()), w4a8, "w4a8"
            return
        self._prepare_torch(qw.q, scale, (8 - qw.zeros.float()) * scale, dense_copy)

    def _prepare_gguf(self, dense_copy: bool, w4a8: ctypes.CDLL | None) -> None:
        """GGUF blocks: w = d q + m per group of 32; the W4A8 kernel takes d and the zero term -m as they are, in its
        blocks layout (fp16 inline with the nibbles, as in the file)."""
        q = unpack_q4(self.q4.data)
        d, m = (t.data.view(torch.float16).float() for t in (self.q4_scales, self.q4_mins))  # exact: fp16 in fp32
        del self.q4, self.q4_scales, self.q4_mins
        if q.device.type == "cuda":
            self.prepare_triton_blocks(q, d, m)
            return
        if w4a8 is not None and self._w4a8_fits():
            self.w4a8, self.w4a8_lib, self.mode = pack_w4a8_blocks(q, d, -m), w4a8, "w4a8"
            return
        self._prepare_torch(q, d, 8 * d + m, dense_copy)

    def _w4a8_fits(self) -> bool:
        """The W4A8 kernel's shapes: its group sizes, in_features in whole 64-value blocks (group 32: two per block);
        GGUF blocks in whole octets of output rows (x86's layout, w4a8_blocks.h)."""
        octets = self.layout != "gguf" or self.out_features % 8 == 0
        return self.group_size in W4A8_GROUP_SIZES and self.in_features % 64 == 0 and octets

    def prepare_triton_blocks(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> None:
        """The Triton W4A16 GEMM with float zero terms (kernels/triton/awq_gemm.py): q in AWQ's packing, d as the
        scales, -m as the zero terms, both fp16 as in the file (a negated fp16 is exact): 2 bytes a group each read per
        call, not 4."""
        from kernels.triton.awq_gemm import awq_pack  # here: importing triton holds ~70 MB a CPU never uses

        self.qweight = awq_pack(q.T.contiguous())
        self.scales, self.zero_terms, self.mode = d.T.half().contiguous(), (-m).T.half().contiguous(), "triton"

    def _prepare_torch(self, q: torch.Tensor, scale: torch.Tensor, zero_f: torch.Tensor, dense_copy: bool) -> None:
        """torch's int4 layout: w = (q - 8) * scale + zero_f, scale and zero_f (out, groups) rounded to bf16."""
        self.scales_zeros = torch.stack([scale.T, zero_f.T], dim=-1).to(torch.bfloat16).contiguous()
        if self.out_features % 16 == 0:
            self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
            self.mode = "int4pack"
            self.block_n = self._layout_block(q)  # known: large calls may dequantize the packed weight
            self.dense_ok = self.block_n > 0
            self.dense = PackedLinear(self._dequantize(q)) if dense_copy else None
        else:  # torch's packer needs out_features % 16 == 0: keep a dense copy instead (rare shapes)
            self.dense = PackedLinear(self._dequantize(q))
            del self.scales_zeros
            self.mode = "dense"

    def _layout_block(self, q: torch.Tensor) -> int:
        """The row-block size of the layout torch packed this weight in, 0 if not one `_unpack_int4pack` reads
        (checked on the first block: the layout is per block, the whole weight would cost seconds per load)."""
        n, k = self.out_features, self.in_features
        if self.packed.shape != (n, k // 2):
            return 0
        fits = (b for b in CPU_BLOCKS_N if n % b == 0 and _unpack_blocks(self.packed[:b], b, k).equal(q[:b]))
        return next(fits, 0)

    def _unpack_int4pack(self) -> torch.Tensor:
        """(out, in) uint8 values back out of torch's int4 layout (checked against the source in prepare)."""
        return _unpack_blocks(self.packed, self.block_n, self.in_features)

    def _dequantize(self, q: torch.Tensor | None = None) -> torch.Tensor:
        """The (out, in) weight in this CPU's dense dtype, from the same (scale, zero) pairs the int4 kernel uses."""
        q = self._unpack_int4pack() if q is None else q
        dtype = dense_dtype("cpu")
        scale, zero_f = self.scales_zeros.float().permute(1, 0, 2).unbind(-1)  # (out, groups) each
        offset = (zero_f - 8 * scale).to(dtype).contiguous()[..., None]  # w = q * scale + offset
        g = q.reshape(self.out_features, -1, self.group_size).to(dtype)
        w = torch.addcmul(offset, g, scale.to(dtype).contiguous()[..., None])
        return w.reshape(self.out_features, self.in_features)

    # ---- forward -------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if self.in_perm is not None:
            rows = rows.index_select(1, self.in_perm)
        if self.mode == "w4a8":
            y = w4a8_linear(self.w4a8_lib, _unit_column_stride(rows.float()), self.w4a8)
        elif self.mode == "triton":
            y = self._forward_triton(rows)
        elif self._use_dense_copy(rows.shape[0]):
            y = self.dense(rows.to(self.dense.dtype))
        elif self.mode == "int4pack" and (rows.shape[0] < DENSE_ROWS or not self.dense_ok):
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                rows.to(torch.bfloat16).contiguous(), self.packed, self.group_size, self.scales_zeros
            )
        elif self.mode == "int4pack":
            w = self._dequantize()
            y = F.linear(rows.to(w.dtype), w)
        else:
            raise RuntimeError("Int4Linear used before prepare()")
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], self.out_features)

    def _use_dense_copy(self, rows: int) -> bool:
        """A kept dense weight: the only copy (shapes torch cannot pack), or the faster one for batches."""
        return self.mode == "dense" or (self.mode == "int4pack" and self.dense is not None and rows >= DENSE_COPY_ROWS)

    def _forward_triton(self, rows: torch.Tensor) -> torch.Tensor:
        from kernels.triton.awq_gemm import awq_gemm

        act = rows if rows.dtype in (torch.float16, torch.bfloat16) else rows.to(torch.float16)
        zero_terms = getattr(self, "zero_terms", None)  # GGUF blocks: float zero terms instead of AWQ's integers
        qzeros = None if zero_terms is not None else self.qzeros
        # scales stay fp16 whatever the activations: the kernel widens them itself (no per-call cast, its launch and bytes)
        return awq_gemm(act.contiguous(), self.qweight, qzeros, self.scales, group_size=self.group_size,
                        zero_terms=zero_terms)

    def weight_bytes(self) -> int:
        """Bytes this layer's weight occupies as prepared (integers + scales/zeros, or the dense weight of a
        shape torch cannot pack); the optional dense copy for batched calls is `dense_copy_bytes`."""
        names = ("packed", "scales_zeros", "qweight", "qzeros", "scales", "q4", "q4_scales", "q4_mins", "zero_terms")
        dense = self.dense.nbytes() if self.mode == "dense" else 0
        w4a8 = self.w4a8.nbytes() if self.mode == "w4a8" else 0
        return sum(_nbytes(getattr(self, n, None)) for n in names) + dense + w4a8

    def dense_copy_bytes(self) -> int:
        dense = getattr(self, "dense", None)
        return dense.nbytes() if self.mode == "int4pack" and dense is not None else 0


def _unpack_blocks(packed: torch.Tensor, block_n: int, k: int) -> torch.Tensor:
    """(rows, k / 2) uint8 in torch's CPU int4 layout with `block_n`-row blocks -> (rows, k) values."""
    v = packed.view(-1, k, block_n // 2)  # (blocks, k, block_n / 2): byte j = rows j and j + block_n / 2
    return torch.cat([v & 15, v >> 4], dim=-1).permute(0, 2, 1).reshape(-1, k)


def _unit_column_stride(x: torch.Tensor) -> torch.Tensor:
    """x as the C kernels read it: rows may be strided, columns not (a copy only in that rare case)."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _nbytes(t: object) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def dequantized_weight(layer: Int4Linear) -> torch.Tensor:
    """The float32 (out, in) weight an unprepared layer stands for; tests compare against it."""
    from backend.quant.awq_format import dequantize

    if layer.layout == "gguf":
        d, m = (t.data.view(torch.float16) for t in (layer.q4_scales, layer.q4_mins))
        return dequantize_blocks(unpack_q4(layer.q4.data), d, m)
    qw: QuantizedWeight = unpack(layer.qweight.data, layer.qzeros.data, layer.scales.data)
    return dequantize(qw)
