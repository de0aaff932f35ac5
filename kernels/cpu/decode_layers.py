"""A decode step's decoder-layer stack in one C call (decode_layers.c), over the other C kernels.

    lib = load_decode_layers(build_dir)                     # None where it cannot run (kernels/cpu/build.py)
    stack = DecodeLayers(lib, entry_points(w4a8, elementwise, paged_decode), dims, layers)
    x, stream = stack(x, rope, block_tables, context_lens, max_len, slot_mapping, kv_cache, block_size)

`layers` holds each layer's RMSNorm weights, its four W4A8 projections and its sliding window; the model side
(backend/model/decode_stack.py) decides which models qualify. The reference is the layer-by-layer path over the same
kernels (backend/model/llama.py with CpuOps), which the result equals bit for bit.
"""

from __future__ import annotations

import _ctypes  # CFuncPtr: ctypes re-exports it as _CFuncPtr at runtime; only _ctypes names it in the type hints
import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from kernels.cpu.build import load_c_kernel
from kernels.cpu.w4a8 import W4A8Weight

SOURCE = Path(__file__).with_suffix(".c")
_p, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class Kernels(ctypes.Structure):
    _fields_ = [(name, _p) for name in ("w4a8", "rms_norm", "rotary", "silu_and_mul", "paged_decode", "store_kv")]


class _Weight(ctypes.Structure):
    _fields_ = [("q", _p), ("scales", _p), ("zeros_t", _p), ("n", _i64), ("k", _i64), ("group", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _p), ("post_norm", _p), ("qkv", _Weight), ("o", _Weight), ("gate_up", _Weight),
                ("down", _Weight), ("window", _i64)]


class Dims(ctypes.Structure):
    _fields_ = [(name, _i64) for name in ("hidden", "heads", "kv_heads", "head_dim", "intermediate")] + [
        ("eps", _f32), ("scale", _f32)]


class _Step(ctypes.Structure):
    _fields_ = [
        ("rope", _p), ("block_tables", _p), ("lens", _p), ("max_blocks", _i64), ("max_len", _i64), ("block_size", _i64),
        ("slots", _p), ("cache", _p), ("layer_stride", _i64), ("half_stride", _i64), ("kv_bf16", ctypes.c_int),
    ]


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer as the kernel reads it (fp32 norm weights, W4A8 projections)."""

    input_norm: torch.Tensor  # (hidden,) float32
    post_norm: torch.Tensor  # (hidden,) float32
    qkv: W4A8Weight  # (heads + 2 kv_heads) * head_dim rows
    o: W4A8Weight
    gate_up: W4A8Weight  # 2 * intermediate rows: [gate | up]
    down: W4A8Weight
    window: int = 0  # sliding window in tokens, 0 = full attention


def load_decode_layers(build_dir: Path) -> ctypes.CDLL | None:
    lib = load_c_kernel(SOURCE, Path(build_dir))
    if lib is not None:
        lib.decode_layers.argtypes = [_p, _p, _p, _i64, _p, _i64, _p, _p, ctypes.c_int]
        lib.decode_layers.restype = ctypes.c_int
    return lib


def entry_points(w4a8: ctypes.CDLL, elementwise: ctypes.CDLL, paged_decode: ctypes.CDLL) -> Kernels:
    """The other kernels' C functions, which the stack calls directly."""
    def address(fn: _ctypes.CFuncPtr) -> int:
        return ctypes.cast(fn, _p).value or 0

    return Kernels(address(w4a8.w4a8_linear), address(elementwise.rms_norm_residual), address(elementwise.rotary_neox),
                   address(elementwise.silu_and_mul), address(paged_decode.paged_decode), address(paged_decode.store_kv))


def _weight(w: W4A8Weight) -> _Weight:
    return _Weight(*w.args, *w.dims)


class DecodeLayers:
    """Every layer of a model for decode batches; holds the structs (and so the weights' pointers) once."""

    def __init__(self, lib: ctypes.CDLL, kernels: Kernels, dims: Dims, layers: list[LayerWeights]) -> None:
        e, hd, kd, i = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim, dims.intermediate
        for lw in layers:
            assert lw.input_norm.shape == lw.post_norm.shape == (e,) and lw.input_norm.dtype == torch.float32
            assert lw.input_norm.is_contiguous() and lw.post_norm.is_contiguous()
            shapes = [w.shape for w in (lw.qkv, lw.o, lw.gate_up, lw.down)]
            assert shapes == [(hd + 2 * kd, e), (e, hd), (2 * i, e), (e, i)], f"projection shapes {shapes}"
        assert dims.head_dim % 16 == 0 and dims.heads % dims.kv_heads == 0 and dims.intermediate % 8 == 0
        self.lib, self.kernels, self.dims = lib, kernels, dims
        self.layers = layers  # keeps the tensors the structs point at alive
        self._structs = (_Layer * len(layers))(*(
            _Layer(lw.input_norm.data_ptr(), lw.post_norm.data_ptr(), _weight(lw.qkv), _weight(lw.o),
                   _weight(lw.gate_up), _weight(lw.down), lw.window) for lw in layers))

    def __call__(
        self, x: torch.Tensor, rope: torch.Tensor, *, block_tables: torch.Tensor, context_lens: torch.Tensor, max_len: int,
        slot_mapping: torch.Tensor, kv_cache: torch.Tensor, block_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (M, hidden) float32 embeddings -> (last layer's MLP output, residual stream), (M, hidden) each.
        rope (M, head_dim) [cos | sin]; block_tables (M, max_blocks) int32; context_lens (M,) int32 (the new token
        included); slot_mapping (M,) int64; kv_cache (layers, 2, slots, kv_heads, head_dim) float32 or bfloat16, slot =
        block * block_size + offset."""
        m, d = x.shape[0], self.dims
        assert x.shape == (m, d.hidden) and x.dtype == torch.float32 and rope.shape == (m, d.head_dim)
        assert block_tables.dtype == context_lens.dtype == torch.int32 and block_tables.shape[0] == context_lens.shape[0] == m
        assert slot_mapping.dtype == torch.int64 and slot_mapping.shape == (m,) and max_len > 0
        assert kv_cache.dim() == 5 and kv_cache.shape[0] == len(self.layers) and kv_cache.shape[3:] == (d.kv_heads, d.head_dim)
        assert kv_cache.dtype in (torch.float32, torch.bfloat16) and kv_cache.is_contiguous()
        x, stream = x.contiguous().clone(), torch.empty_like(x)  # the kernel writes x in place
        held = rope.contiguous(), block_tables.contiguous(), context_lens.contiguous(), slot_mapping.contiguous()
        rope, tables, lens, slots = held  # referenced until the call returns
        step = _Step(rope.data_ptr(), tables.data_ptr(), lens.data_ptr(), tables.shape[1], max_len, block_size, slots.data_ptr(),
                     kv_cache.data_ptr(), kv_cache.stride(0), kv_cache.stride(1), int(kv_cache.dtype == torch.bfloat16))
        if self.lib.decode_layers(ctypes.byref(self.kernels), ctypes.byref(self.dims), self._structs, len(self.layers),
                                  ctypes.byref(step), m, x.data_ptr(), stream.data_ptr(), torch.get_num_threads()):
            raise MemoryError(f"decode_layers: no memory for the activations of {m} tokens")
        return x, stream
