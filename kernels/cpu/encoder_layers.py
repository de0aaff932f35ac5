"""A BERT encoder's layer stack in one C call (encoder_layers.c), over the W8A8 GEMM and LayerNorm kernels.

    lib = load_encoder_layers(build_dir)                    # None where it cannot run (kernels/cpu/build.py)
    stack = EncoderLayers(lib, entry_points(w8a8, elementwise), dims, layers)
    hidden = stack(x, mask)                                 # x (batch, seq, hidden) after the embeddings' LayerNorm
    out = encoder_attention(lib, qkv, mask, heads)          # the stack's attention alone (tests)
    ref = encoder_attention_ref(qkv, mask, heads)           # the same in torch

backend/embed/minilm.py decides which encoders qualify (int8 weights, the C LayerNorm). The reference is its
layer-by-layer path over the same kernels: everything but the attention is the same arithmetic in the same order.
"""

from __future__ import annotations

import _ctypes  # CFuncPtr: ctypes re-exports it as _CFuncPtr at runtime; only _ctypes names it in the type hints
import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from kernels.cpu.build import load_c_kernel
from kernels.cpu.w8a8 import W8A8Weight

SOURCE = Path(__file__).with_suffix(".c")
_p, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class Kernels(ctypes.Structure):
    _fields_ = [("w8a8", _p), ("layer_norm", _p)]


class _Weight(ctypes.Structure):
    _fields_ = [("q", _p), ("scales", _p), ("bias", _p), ("n", _i64), ("k", _i64), ("group", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Weight), ("out", _Weight), ("up", _Weight), ("down", _Weight)] + [
        (name, _p) for name in ("attn_norm_w", "attn_norm_b", "mlp_norm_w", "mlp_norm_b")
    ]


class Dims(ctypes.Structure):
    _fields_ = [(name, _i64) for name in ("hidden", "heads", "head_dim", "intermediate")] + [("eps", _f32)]


@dataclass(frozen=True)
class Projection:
    weight: W8A8Weight
    bias: torch.Tensor  # (N,) float32, contiguous


@dataclass(frozen=True)
class LayerWeights:
    """One encoder layer as the kernel reads it: W8A8 projections with their biases, fp32 LayerNorms."""

    qkv: Projection  # 3 * hidden rows: [q | k | v]
    out: Projection
    up: Projection  # GELU follows it
    down: Projection
    attn_norm: tuple[torch.Tensor, torch.Tensor]  # (weight, bias), (hidden,) float32 each
    mlp_norm: tuple[torch.Tensor, torch.Tensor]


def load_encoder_layers(build_dir: Path) -> ctypes.CDLL | None:
    lib = load_c_kernel(SOURCE, Path(build_dir))
    if lib is not None:
        lib.encoder_layers.argtypes = [_p, _p, _p, _i64, _p, _i64, _i64, _p, ctypes.c_int]
        lib.encoder_layers.restype = ctypes.c_int
        lib.encoder_attention.argtypes = [_p, _p, _i64, _i64, _i64, _i64, _p, _p, ctypes.c_int]
        lib.encoder_attention.restype = None
    return lib


def entry_points(w8a8: ctypes.CDLL, elementwise: ctypes.CDLL) -> Kernels:
    """The other kernels' C functions, which the stack calls directly."""

    def address(fn: _ctypes.CFuncPtr) -> int:
        return ctypes.cast(fn, _p).value or 0

    return Kernels(address(w8a8.w8a8_linear), address(elementwise.layer_norm_residual))


def _weight(p: Projection) -> _Weight:
    n, k = p.weight.q.shape
    return _Weight(*p.weight.args, p.bias.data_ptr(), n, k, p.weight.group_size)


def _layer(lw: LayerWeights) -> _Layer:
    norms = (t.data_ptr() for t in (*lw.attn_norm, *lw.mlp_norm))
    return _Layer(_weight(lw.qkv), _weight(lw.out), _weight(lw.up), _weight(lw.down), *norms)


class EncoderLayers:
    """Every layer of an encoder; holds the structs (and so the weights' pointers) once."""

    def __init__(self, lib: ctypes.CDLL, kernels: Kernels, dims: Dims, layers: list[LayerWeights]) -> None:
        e, i = dims.hidden, dims.intermediate
        for lw in layers:
            shapes = [p.weight.q.shape for p in (lw.qkv, lw.out, lw.up, lw.down)]
            assert shapes == [(3 * e, e), (e, e), (i, e), (e, i)], f"projection shapes {shapes}"
            for p in (lw.qkv, lw.out, lw.up, lw.down):
                assert p.bias.shape == (p.weight.q.shape[0],) and p.bias.dtype == torch.float32 and p.bias.is_contiguous()
            for t in (*lw.attn_norm, *lw.mlp_norm):
                assert t.shape == (e,) and t.dtype == torch.float32 and t.is_contiguous()
        assert dims.heads * dims.head_dim == e and dims.head_dim % 8 == 0 and e % 8 == 0
        self.lib, self.kernels, self.dims = lib, kernels, dims
        self.layers = layers  # keeps the tensors the structs point at alive
        self._structs = (_Layer * len(layers))(*(_layer(lw) for lw in layers))

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x (batch, seq, hidden) float32 -> the last layer's hidden states, same shape; mask (batch, seq) bool, True
        for real tokens (None: no padding)."""
        b, s, e = x.shape
        assert e == self.dims.hidden and x.dtype == torch.float32
        held = _mask_bytes(mask, b, s)  # referenced until the call returns
        x = x.contiguous().clone()  # the kernel writes x in place
        mask_ptr = held.data_ptr() if held is not None else None
        if self.lib.encoder_layers(
            ctypes.byref(self.kernels),
            ctypes.byref(self.dims),
            self._structs,
            len(self.layers),
            mask_ptr,
            b,
            s,
            x.data_ptr(),
            torch.get_num_threads(),
        ):
            raise MemoryError(f"encoder_layers: no memory for the activations of {b} x {s} tokens")
        return x


def encoder_attention(lib: ctypes.CDLL, qkv: torch.Tensor, mask: torch.Tensor | None, heads: int) -> torch.Tensor:
    """qkv (batch, seq, 3 * hidden) float32 [q | k | v] -> attention output (batch, seq, hidden); mask as above."""
    b, s, width = qkv.shape
    hidden = width // 3
    assert qkv.dtype == torch.float32 and width == 3 * hidden and hidden % heads == 0 and (hidden // heads) % 8 == 0
    qkv, held = qkv.contiguous(), _mask_bytes(mask, b, s)
    out = torch.empty(b, s, hidden)
    scores = torch.empty(b * heads * ((s + 7) // 8 * 8))
    lib.encoder_attention(
        qkv.data_ptr(),
        held.data_ptr() if held is not None else None,
        b,
        s,
        heads,
        hidden // heads,
        scores.data_ptr(),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out


def encoder_attention_ref(qkv: torch.Tensor, mask: torch.Tensor | None, heads: int) -> torch.Tensor:
    """SDPA with padding keys masked out: backend/embed/minilm.py's layer loop attends with it."""
    b, s, _ = qkv.shape
    q, k, v = qkv.view(b, s, 3, heads, -1).permute(2, 0, 3, 1, 4)  # (batch, heads, seq, head_dim)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask[:, None, None, :])
    return out.transpose(1, 2).reshape(b, s, -1)


def _mask_bytes(mask: torch.Tensor | None, batch: int, seq: int) -> torch.Tensor | None:
    if mask is None:
        return None
    assert mask.shape == (batch, seq), f"mask must be (batch, seq) = ({batch}, {seq})"
    return mask.to(torch.uint8).contiguous()
