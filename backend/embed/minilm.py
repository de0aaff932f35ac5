"""A BERT encoder forward (all-MiniLM-L6-v2 and other BertModel checkpoints) built for short CPU queries.

The semantic cache embeds one short user message per request, on the request's path, so the embedder's
latency is the cache hit's latency. transformers' BertModel spends most of a 10-token forward in
per-call overhead: separate q/k/v projections, mask building, dropout and head-reshaping modules, and
F.linear re-laying out every weight for oneDNN. This forward does the same arithmetic with fused QKV,
weights prepacked once (backend/quant/cpu_gemm.py), GELU fused into the up-projection and no mask when the
batch has no padding. Where the C kernels build (x86 AVX2), each LayerNorm and the residual add before it are
one call (kernels/cpu/elementwise.c), and the int8 GEMMs add their bias and GELU in their epilogue; an int8
encoder then runs its whole layer stack in one C call (kernels/cpu/encoder_layers.c): a 10-token query's
forward 1.2-1.3x faster than the layer loop, whose ~40 calls a query were mostly dispatch. transformers still
loads the weights; `tests/test_minilm.py` checks this forward against BertModel's.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from backend.config import cache_dir
from backend.quant.cpu_gemm import HalfWeightLinear, Int8ActLinear, PackedLinear
from kernels.cpu import encoder_layers as stack_kernel
from kernels.cpu.elementwise import layer_norm_residual, load_elementwise
from kernels.cpu.encoder_layers import encoder_attention_ref
from kernels.cpu.w8a8 import load_w8a8, w8a8_group

if TYPE_CHECKING:  # what transformers loads (which mypy reads as Any: pyproject.toml's transformers override)
    from transformers import BertModel
    from transformers.models.bert.modeling_bert import BertLayer

Gemm = PackedLinear | HalfWeightLinear | Int8ActLinear


def _packed(*linears: nn.Linear, dtype: torch.dtype) -> Gemm:
    """One prepacked GEMM computing the given linears side by side (fused q/k/v). float16: fp16 weights with fp32
    arithmetic (`HalfWeightLinear`); int8: int8 weights and activations (`Int8ActLinear`, the W8A8 C kernel);
    otherwise weights and arithmetic in `dtype`."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = torch.cat([lin.bias.detach() for lin in linears])
    if dtype == torch.float16:
        return HalfWeightLinear(weight, bias)
    if dtype == torch.int8:
        lib = load_w8a8(cache_dir() / "kernels")
        if lib is None or not w8a8_group(weight.shape[1]):
            raise ValueError("embedding dtype int8 needs the C kernels (x86 AVX2 or aarch64 dot product, and a compiler)")
        return Int8ActLinear(weight, bias, lib)
    return PackedLinear(weight.to(dtype), bias.to(dtype))


@dataclass
class _Norm:
    """LayerNorm(x + residual): one C call for float32 activations where the kernels build (`lib`), else torch's."""

    weight: torch.Tensor
    bias: torch.Tensor
    eps: float
    lib: ctypes.CDLL | None

    @classmethod
    def of(cls, norm: nn.LayerNorm, dtype: torch.dtype, lib: ctypes.CDLL | None) -> _Norm:
        w, b = norm.weight.detach().to(dtype).contiguous(), norm.bias.detach().to(dtype).contiguous()
        return cls(w, b, norm.eps, lib if dtype == torch.float32 and w.shape[0] % 8 == 0 else None)

    def __call__(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x, residual: (..., hidden), the same shape."""
        if self.lib is None:
            return F.layer_norm(x + residual, x.shape[-1:], self.weight, self.bias, self.eps)
        hidden = x.shape[-1]
        rows, res = x.reshape(-1, hidden), residual.reshape(-1, hidden)
        return layer_norm_residual(self.lib, rows, res, self.weight, bias=self.bias, eps=self.eps).view(x.shape)


@dataclass
class _Layer:
    qkv: Gemm
    out: Gemm
    attn_norm: _Norm
    up: Gemm  # GELU fused in
    down: Gemm
    mlp_norm: _Norm


class BertEncoder:
    """Last hidden states of a BertModel (post-norm encoder, absolute positions, token type 0)."""

    def __init__(self, bert: BertModel, dtype: torch.dtype = torch.float32, share: BertEncoder | None = None) -> None:
        """dtype: float32 or bfloat16 (weights and arithmetic), float16 (fp16 weights, fp32 arithmetic) or int8 (int8
        weights and activations, fp32 elsewhere). share: an encoder of the same model whose embedding tables (the word
        table is 47 MB of MiniLM's ~90) this one reuses where its activations have the same dtype."""
        cfg = bert.config
        if cfg.hidden_act != "gelu" or getattr(cfg, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported BERT variant: hidden_act={cfg.hidden_act}, positions={cfg.position_embedding_type}")
        self.dtype = torch.float32 if dtype in (torch.float16, torch.int8) else dtype  # the activations'
        self.num_heads: int = cfg.num_attention_heads
        norm_lib = load_elementwise(cache_dir() / "kernels")  # None where the C kernels cannot run
        emb = bert.embeddings
        self.word: torch.Tensor
        self.position: torch.Tensor
        self.emb_norm: _Norm
        if share is not None and share.dtype == self.dtype:
            self.word, self.position, self.emb_norm = share.word, share.position, share.emb_norm
        else:
            self.word = emb.word_embeddings.weight.detach().to(self.dtype)
            # Token type 0 for every token (sentence embeddings have one segment): fold it into the positions.
            self.position = (emb.position_embeddings.weight + emb.token_type_embeddings.weight[0]).detach().to(self.dtype)
            self.emb_norm = _Norm.of(emb.LayerNorm, self.dtype, norm_lib)
        self.layers = [self._layer(layer, dtype, self.dtype, norm_lib) for layer in bert.encoder.layer]
        # the layers in one C call, where they all run on the C kernels (int8)
        self.stack = _stack(self.layers, self.num_heads, cfg.intermediate_size)

    @staticmethod
    def _layer(layer: BertLayer, weights: torch.dtype, activations: torch.dtype, norm_lib: ctypes.CDLL | None) -> _Layer:
        att = layer.attention
        return _Layer(
            qkv=_packed(att.self.query, att.self.key, att.self.value, dtype=weights),
            out=_packed(att.output.dense, dtype=weights),
            attn_norm=_Norm.of(att.output.LayerNorm, activations, norm_lib),
            up=_packed(layer.intermediate.dense, dtype=weights),
            down=_packed(layer.output.dense, dtype=weights),
            mlp_norm=_Norm.of(layer.output.LayerNorm, activations, norm_lib),
        )

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask: (batch, seq) -> (batch, seq, hidden) in float32."""
        batch, seq = input_ids.shape
        positions = self.position[:seq].expand(batch, seq, -1)
        x = self.emb_norm(self.word[input_ids], positions)  # (batch, seq, hidden)
        # Padding keys are masked out; an unpadded batch (a single query) needs no mask at all.
        keys = None if bool(attention_mask.all()) else attention_mask.bool()  # (batch, seq)
        if self.stack is not None:
            return self.stack(x, keys)
        for layer in self.layers:
            x = layer.attn_norm(layer.out(encoder_attention_ref(layer.qkv(x), keys, self.num_heads)), x)
            x = layer.mlp_norm(layer.down(layer.up(x, activation="gelu")), x)
        return x.float()


def _stack(layers: list[_Layer], heads: int, intermediate: int) -> stack_kernel.EncoderLayers | None:
    """kernels/cpu/encoder_layers.c over these layers' kernels, where every GEMM is int8 (W8A8) and every LayerNorm
    the C one: the same arithmetic as the layer loop but for attention, without ~40 Python-side calls a query."""
    gemms = [g for layer in layers for g in (layer.qkv, layer.out, layer.up, layer.down)]
    norms = [n for layer in layers for n in (layer.attn_norm, layer.mlp_norm)]
    int8 = [g for g in gemms if isinstance(g, Int8ActLinear)]
    norm_libs = [n.lib for n in norms if n.lib is not None]
    if not layers or len(int8) < len(gemms) or len(norm_libs) < len(norms):
        return None
    lib = stack_kernel.load_encoder_layers(cache_dir() / "kernels")
    hidden = norms[0].weight.shape[0]
    if lib is None or hidden % heads or (hidden // heads) % 8:
        return None
    kernels = stack_kernel.entry_points(int8[0].lib, norm_libs[0])
    dims = stack_kernel.Dims(hidden, heads, hidden // heads, intermediate, norms[0].eps)
    return stack_kernel.EncoderLayers(lib, kernels, dims, [_weights(layer) for layer in layers])


def _weights(layer: _Layer) -> stack_kernel.LayerWeights:
    def projection(g: Gemm) -> stack_kernel.Projection:
        assert isinstance(g, Int8ActLinear) and g.bias is not None
        return stack_kernel.Projection(g.weight, g.bias)

    return stack_kernel.LayerWeights(
        projection(layer.qkv),
        projection(layer.out),
        projection(layer.up),
        projection(layer.down),
        (layer.attn_norm.weight, layer.attn_norm.bias),
        (layer.mlp_norm.weight, layer.mlp_norm.bias),
    )
