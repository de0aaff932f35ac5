"""A decode step's decoder-layer stack in one C call (decode_layers.c), over the other C kernels.

    lib = load_decode_layers(build_dir)                     # None where it cannot run (kernels/cpu/build.py)
    stack = DecodeLayers(lib, entry_points(elementwise, paged_decode, w4a8=lib4), dims, layers)  # or wg8a8=lib8
    x, stream = stack(x, ropes, views, caches, block_size=block_size)  # views: PoolView per K/V pool

`layers` holds each layer's RMSNorm weights (QK-norm's and sandwich norms' where the model has them), its four
projections (W4A8 weights, kernels/cpu/w4a8.py, or grouped W8A8 ones in any of their layouts, kernels/cpu/wg8a8.py),
its sliding window and its rope table; the model side (backend/model/decode_stack.py) decides which models qualify.
The reference is the layer-by-layer path over the same kernels (backend/model/llama.py with CpuOps), which the result
equals bit for bit.
"""

from __future__ import annotations

import _ctypes  # CFuncPtr: ctypes re-exports it as _CFuncPtr at runtime; only _ctypes names it in the type hints
import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.cpu.build import load_c_kernel
from kernels.cpu.w4a8 import W4A8Weight
from kernels.cpu.wg8a8 import PackedGrouped

SOURCE = Path(__file__).with_suffix(".c")
_p, _i64, _f32, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class Kernels(ctypes.Structure):
    _fields_ = [(name, _p) for name in ("w4a8", "wg8a8", "wg4a8", "wg5a8", "rms_norm", "rotary", "silu_and_mul",
                                        "gelu_and_mul", "paged_decode", "store_kv")]


W4A8, WG8A8, WG4A8, WG5A8 = range(4)  # decode_layers.c's weight kinds
Projection = W4A8Weight | PackedGrouped


class _Weight(ctypes.Structure):
    _fields_ = [("kind", _int), ("q", _p), ("scales", _p), ("zeros", _p), ("hi", _p), ("n", _i64), ("k", _i64),
                ("group", _i64), ("half", _int), ("offset", ctypes.c_int32)]


_NORMS = ("input_norm", "post_norm", "q_norm", "k_norm", "pre_ff_norm", "post_ff_norm")


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, _p) for name in _NORMS), ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight), ("down", _Weight),
        ("window", _i64), ("rope", _i64),
    ]


class Dims(ctypes.Structure):
    _fields_ = [
        *((name, _i64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")), ("eps", _f32),
        ("scale", _f32), ("gelu", _int),
    ]


class _View(ctypes.Structure):
    _fields_ = [("block_tables", _p), ("lens", _p), ("max_blocks", _i64), ("max_len", _i64), ("slots", _p)]


class _Step(ctypes.Structure):
    _fields_ = [("rope", _p * 2), ("views", _View * 2), ("block_size", _i64), ("caches", _p), ("half_strides", _p),
                ("kv_bf16", _int)]


@dataclass(frozen=True)
class PoolView:
    """A decode step's tokens as one pool of K/V blocks indexes them (the full-attention layers' pool, or the windowed
    layers' own)."""

    block_tables: torch.Tensor  # (M, max_blocks) int32
    context_lens: torch.Tensor  # (M,) int32: tokens in the cache, the new one included
    max_len: int  # max(context_lens)
    slot_mapping: torch.Tensor  # (M,) int64: where each token's K/V goes, slot = block * block_size + offset

    def struct(self, m: int) -> _View:
        assert self.block_tables.dtype == self.context_lens.dtype == torch.int32 and self.max_len > 0
        assert self.block_tables.shape[0] == self.context_lens.shape[0] == m and self.block_tables.is_contiguous()
        assert self.slot_mapping.dtype == torch.int64 and self.slot_mapping.shape == (m,)
        assert self.context_lens.is_contiguous() and self.slot_mapping.is_contiguous()
        return _View(self.block_tables.data_ptr(), self.context_lens.data_ptr(), self.block_tables.shape[1],
                     self.max_len, self.slot_mapping.data_ptr())


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the kernel reads it (fp32 norm weights, W4A8 or grouped W8A8 projections)."""

    input_norm: torch.Tensor  # (hidden,) float32
    post_norm: torch.Tensor  # (hidden,) float32: after attention (with sandwich norms, of the attention output alone)
    qkv: Projection  # (heads + 2 kv_heads) * head_dim rows
    o: Projection
    gate_up: Projection  # 2 * intermediate rows: [gate | up]
    down: Projection
    window: int = 0  # sliding window in tokens, 0 = full attention
    rope: int = 0  # the rope table it rotates with (Gemma 3: one per layer type)
    q_norm: torch.Tensor | None = None  # (head_dim,) float32 each: QK-norm (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    pre_ff_norm: torch.Tensor | None = None  # (hidden,) float32 each: sandwich norms (Gemma 3)
    post_ff_norm: torch.Tensor | None = None

    def norms(self) -> list[torch.Tensor | None]:
        return [self.input_norm, self.post_norm, self.q_norm, self.k_norm, self.pre_ff_norm, self.post_ff_norm]

    def projections(self) -> list[Projection]:
        return [self.qkv, self.o, self.gate_up, self.down]


def load_decode_layers(build_dir: Path) -> ctypes.CDLL | None:
    lib = load_c_kernel(SOURCE, Path(build_dir))
    if lib is not None:
        lib.decode_layers.argtypes = [_p, _p, _p, _i64, _p, _i64, _p, _p, ctypes.c_int]
        lib.decode_layers.restype = ctypes.c_int
    return lib


def entry_points(elementwise: ctypes.CDLL, paged_decode: ctypes.CDLL, *, w4a8: ctypes.CDLL | None = None,
                 wg8a8: ctypes.CDLL | None = None) -> Kernels:
    """The other kernels' C functions, which the stack calls directly (the GEMMs of the library given; NULL for the
    others, which a stack of its weights never calls)."""
    def address(lib: ctypes.CDLL | None, name: str) -> int:
        fn: _ctypes.CFuncPtr | None = getattr(lib, name, None) if lib is not None else None
        return (ctypes.cast(fn, _p).value or 0) if fn is not None else 0

    gemms = [address(w4a8, "w4a8_linear")] + [address(wg8a8, f"wg{bits}a8_linear") for bits in (8, 4, 5)]
    return Kernels(*gemms, address(elementwise, "rms_norm_residual"), address(elementwise, "rotary_neox"),
                   address(elementwise, "silu_and_mul"), address(elementwise, "gelu_tanh_and_mul"),
                   address(paged_decode, "paged_decode"), address(paged_decode, "store_kv"))


def _weight(w: Projection) -> _Weight:
    if isinstance(w, W4A8Weight):
        return _Weight(W4A8, *w.args, None, *w.dims, 0, 0)
    q, scales, zeros, half, fifth = w.args
    kind = WG5A8 if fifth is not None else WG4A8 if w.nibbles else WG8A8
    return _Weight(kind, q, scales, zeros, fifth, w.padded, w.shape[1], w.group, half, w.offset)


def _rows(w: Projection) -> tuple[int, int]:
    """The output the kernel writes and its input: (N, K), the grouped layouts' N with their padding rows."""
    return (w.padded, w.shape[1]) if isinstance(w, PackedGrouped) else w.shape


class DecodeLayers:
    """Every layer of a model for decode batches; holds the structs (and so the weights' pointers) once."""

    def __init__(self, lib: ctypes.CDLL, kernels: Kernels, dims: Dims, layers: list[LayerWeights]) -> None:
        e, hd, kd, i = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.intermediate
        for lw in layers:
            sizes = [e, e, dims.head_dim, dims.head_dim, e, e]
            for norm, size in zip(lw.norms(), sizes, strict=True):
                assert norm is None or (norm.shape == (size,) and norm.dtype == torch.float32 and norm.is_contiguous())
            assert lw.rope in (0, 1)  # the step carries two rope tables at most
            assert (lw.q_norm is None) == (lw.k_norm is None) and (lw.pre_ff_norm is None) == (lw.post_ff_norm is None)
            shapes = [_rows(w) for w in lw.projections()]
            assert shapes == [(hd + 2 * kd, e), (e, hd), (2 * i, e), (e, i)], f"projection shapes {shapes}"
        assert dims.head_dim % 16 == 0 and dims.heads % dims.kv_heads == 0 and dims.intermediate % 8 == 0
        self.lib, self.kernels, self.dims = lib, kernels, dims
        self.layers = layers  # keeps the tensors the structs point at alive
        self._structs = (_Layer * len(layers))(*(
            _Layer(*(None if n is None else n.data_ptr() for n in lw.norms()), *map(_weight, lw.projections()),
                   lw.window, lw.rope) for lw in layers))
        self.ropes = 1 + max(lw.rope for lw in layers)

    def __call__(
        self, x: torch.Tensor, ropes: list[torch.Tensor], views: list[PoolView], caches: list[torch.Tensor], *,
        block_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (M, hidden) float32 embeddings -> (last layer's MLP output, residual stream), (M, hidden) each.
        ropes: the rope tables the layers name, (M, head_dim) [cos | sin] each; views: the full-attention layers'
        pool view, then the windowed layers' where they have a pool of their own; caches: each layer's (2, slots,
        kv_heads, head_dim), float32 or bfloat16, all one dtype."""
        m, d = x.shape[0], self.dims
        assert x.shape == (m, d.hidden) and x.dtype == torch.float32 and len(ropes) >= self.ropes
        assert all(r.shape == (m, d.head_dim) and r.dtype == torch.float32 for r in ropes)
        assert 1 <= len(views) <= 2 and len(caches) == len(self.layers)
        dtype = caches[0].dtype
        for c in caches:
            assert c.dim() == 4 and c.shape[0] == 2 and c.shape[2:] == (d.kv_heads, d.head_dim) and c.is_contiguous()
            assert c.dtype == dtype and dtype in (torch.float32, torch.bfloat16)
        x, stream = x.contiguous().clone(), torch.empty_like(x)  # the kernel writes x in place
        held = [r.contiguous() for r in ropes[: self.ropes]]  # referenced until the call returns
        rope = (_p * 2)(*(r.data_ptr() for r in held), *([None] * (2 - len(held))))
        pools = (_View * 2)(*(v.struct(m) for v in (views[0], views[-1])))
        pointers = (_p * len(caches))(*(c.data_ptr() for c in caches))
        strides = (_i64 * len(caches))(*(c.stride(0) for c in caches))
        step = _Step(rope, pools, block_size, ctypes.cast(pointers, _p), ctypes.cast(strides, _p),
                     int(dtype == torch.bfloat16))
        if self.lib.decode_layers(ctypes.byref(self.kernels), ctypes.byref(self.dims), self._structs, len(self.layers),
                                  ctypes.byref(step), m, x.data_ptr(), stream.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"decode_layers: no memory for the activations of {m} tokens")
        return x, stream
