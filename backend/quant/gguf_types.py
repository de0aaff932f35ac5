"""GGUF block types -> GroupedInt8 (kernels/cpu/wg8a8.py): each type's own values, no re-quantization.

Every type below is, per weight, an integer q (|q| < 128) times a float32 scale per group of 16 or 32, plus for some
a float32 term per group of 32. Each decoder mirrors gguf-py's reference dequantization (gguf/quants.py) operation for
operation, so `GroupedInt8.dequantized()` (scale * q, then + term) is bit-identical to `gguf.quants.dequantize`:

    type   group  q                       scale                     term
    Q4_0   32     nibble - 8              d                         -
    Q4_1   32     nibble                  d                         m
    Q5_0   32     5 bits - 16             d                         -
    Q5_1   32     5 bits                  d                         m
    Q8_0   32     int8                    d                         -
    Q3_K   16     2 bits - 4 (hmask)      d * (6-bit scale - 32)    -
    Q4_K   32     nibble                  d * 6-bit scale           -(dmin * 6-bit min)
    Q5_K   32     5 bits                  d * 6-bit scale           -(dmin * 6-bit min)
    Q6_K   16     6 bits - 32             d * int8 scale            -

(d, m, dmin fp16 widened to float32; K-quants come in super-blocks of 256.) Q2_K (a term per 16) and every other type
are not served this way: `decode` returns None and the caller dequantizes them.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels.cpu.wg8a8 import GroupedInt8

QK = 256  # a K-quant super-block's weights
SERVED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_F16 = np.float16


def _f16(b: np.ndarray) -> np.ndarray:
    """(blocks, 2) bytes -> (blocks, 1) float32."""
    return np.ascontiguousarray(b).view(_F16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(blocks, 16) bytes -> (blocks, 32): the low nibbles, then the high ones (the 32-blocks' order)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _bits(qh: np.ndarray, n: int) -> np.ndarray:
    """(blocks, 4) bytes, a little-endian uint32 each -> (blocks, n) its low n bits."""
    word = np.ascontiguousarray(qh).view(np.uint32)
    return ((word >> np.arange(n, dtype=np.uint32)) & 1).astype(np.uint8)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (gguf-py's get_scale_min)."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _blocks_32(kind: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(blocks, bytes) of a 32-weight type -> q (blocks, 32) int8, scale (blocks, 1), term (blocks, 1) or None."""
    if kind == "Q8_0":
        return b[:, 2:].view(np.int8), _f16(b[:, :2]), None
    if kind == "Q4_0":
        return _nibbles(b[:, 2:]).astype(np.int8) - 8, _f16(b[:, :2]), None
    if kind == "Q4_1":
        return _nibbles(b[:, 4:]).astype(np.int8), _f16(b[:, :2]), _f16(b[:, 2:4])
    if kind == "Q5_0":
        q = _nibbles(b[:, 6:]) | (_bits(b[:, 2:6], 32) << 4)
        return q.astype(np.int8) - 16, _f16(b[:, :2]), None
    if kind == "Q5_1":
        q = _nibbles(b[:, 8:]) | (_bits(b[:, 4:8], 32) << 4)
        return q.astype(np.int8), _f16(b[:, :2]), _f16(b[:, 2:4])
    raise AssertionError(kind)


def _blocks_k(kind: str, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(super-blocks, bytes) of a K-quant -> q (blocks, 256) int8, scales (blocks, 256 / G), terms (blocks, 8) or None."""
    n = b.shape[0]
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = _k_scales(b[:, 4:16])
        if kind == "Q4_K":
            qs = b[:, 16:144].reshape(n, 4, 32)  # 32 bytes per 64 weights: low nibbles, then high
            q = np.stack([qs & 15, qs >> 4], axis=2).reshape(n, QK)
        else:
            qh = b[:, 16:48].reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
            qs = b[:, 48:176].reshape(n, 4, 32)
            ql = np.stack([qs & 15, qs >> 4], axis=2).reshape(n, 8, 32)
            q = (ql | ((qh & 1) << 4)).reshape(n, QK)
        return q.astype(np.int8), d * sc, -(dmin * mn)
    if kind == "Q6_K":
        ql = b[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        ql = (ql & 15).reshape(n, 8, 32)
        qh = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        qh = (qh & 3).reshape(n, 8, 32)
        q = (ql | (qh << 4)).astype(np.int8) - 32
        scales = b[:, 192:208].view(np.int8).astype(np.float32)
        return q.reshape(n, QK), _f16(b[:, 208:210]) * scales, None
    if kind == "Q3_K":
        hmask, qs, raw, d = b[:, :32], b[:, 32:96], b[:, 96:108], _f16(b[:, 108:110])
        lo = (raw[:, :8].reshape(n, 1, 8) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(n, 16)
        hi = (raw[:, 8:12].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(n, 16)
        scales = ((lo & 0x0F) | ((hi & 0x03) << 4)).astype(np.int8) - 32
        ql = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)).reshape(n, 16, 16) & 3
        qh = (hmask.reshape(n, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).reshape(n, 16, 16) & 1
        q = ql.astype(np.int8) - ((qh ^ 1) << 2).astype(np.int8)
        return q.reshape(n, QK), d * scales.astype(np.float32), None
    raise AssertionError(kind)


def decode(kind: str, raw: np.ndarray, shape: tuple[int, int]) -> GroupedInt8 | None:
    """A GGUF tensor's raw bytes (rows, row bytes) of type `kind`, HF shape (out, in) -> its GroupedInt8, or None for
    a type not served this way (the caller dequantizes)."""
    if kind not in SERVED:
        return None
    out, k = shape
    per = QK if kind.endswith("_K") else 32
    if k % per:
        return None
    blocks = np.ascontiguousarray(raw).reshape(out * (k // per), -1)
    q, s, z = (_blocks_k if kind.endswith("_K") else _blocks_32)(kind, blocks)
    tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a)).reshape(out, -1)  # noqa: E731
    return GroupedInt8(tensor(q).contiguous(), tensor(s.astype(np.float32)), None if z is None else tensor(z.astype(np.float32)))
