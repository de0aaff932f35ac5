"""Int4Linear (the engine's W4A16 layer) against a float32 matmul with the dequantized weight.

The int4 kernel computes with bf16 activations, so the reference rounds x to bf16 too; the dense copy computes
in this CPU's dense dtype (bf16 where native, else fp32), so its reference rounds x to that. What is left is the
arithmetic and the bf16 (scale, zero) pairs, well under 1%.
"""

from __future__ import annotations

import pytest
import torch

from backend.quant.awq_format import pack, quantize
from backend.quant.cpu_gemm import dense_dtype
from backend.quant.int4_linear import DENSE_COPY_ROWS, DENSE_ROWS, Int4Linear, dequantized_weight
from backend.quant.lm_head import LowBitHead

TOL = 6e-3  # max |error| relative to max |reference|, int4 kernel (bf16 scale and zero per group)
DENSE_TOL = 1e-2  # the prefill path rounds the dequantized weight to bf16 too


def make_layer(out_f: int, in_f: int, group: int, bias: bool, seed: int = 0) -> tuple[Int4Linear, torch.Tensor]:
    """An Int4Linear loaded the way the loader loads one (AWQ tensors assigned), and its float32 weight."""
    g = torch.Generator().manual_seed(seed)
    layer = Int4Linear(in_f, out_f, group, bias)
    for name, t in pack(quantize(torch.randn(out_f, in_f, generator=g) * 0.05, group)).items():
        getattr(layer, name).data = t
    if bias:
        layer.bias.data = torch.randn(out_f, generator=g)
    return layer, dequantized_weight(layer)


def check(layer: Int4Linear, weight: torch.Tensor, rows: int, bias: torch.Tensor | None = None) -> None:
    copy = layer.mode == "int4pack" and layer.dense is not None and rows >= DENSE_COPY_ROWS
    dense = layer.mode == "dense" or copy or (rows >= DENSE_ROWS and layer.dense_ok)
    x = torch.randn(rows, layer.in_features, generator=torch.Generator().manual_seed(rows))
    ref = x.to(dense_dtype("cpu") if dense else torch.bfloat16).float() @ weight.T
    if bias is not None:
        ref = ref + bias
    y = layer(x)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = ((y - ref).abs().max() / ref.abs().max()).item()
    assert err < (DENSE_TOL if dense else TOL), f"{layer.mode} rows={rows}: relative error {err:.2e}"


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("rows", [1, 7, 32, DENSE_ROWS + 3])  # decode, odd, 32 streams, prefill (dense path)
def test_int4pack_layer_matches_dequantized_matmul(group: int, rows: int) -> None:
    layer, weight = make_layer(192, 384, group, bias=False)
    layer.prepare()
    assert layer.mode == "int4pack" and layer.dense_ok
    check(layer, weight, rows)


def test_bias_and_3d_input() -> None:
    layer, weight = make_layer(128, 256, 64, bias=True)
    bias = layer.bias.data.clone()
    layer.prepare()
    check(layer, weight, 5, bias)
    x = torch.randn(2, 3, 256)
    assert torch.allclose(layer(x).view(6, -1), layer(x.view(6, 256)))


def test_layout_probe_falls_back_for_unknown_layout() -> None:
    """48 output rows: torch packs it, but not in the 64- (AVX-512) or 32-row (AVX2) blocks we know how to unpack
    -> never dequantize."""
    layer, weight = make_layer(48, 128, 32, bias=False)
    layer.prepare(dense_copy=False)
    assert layer.mode == "int4pack" and not layer.dense_ok
    check(layer, weight, DENSE_ROWS + 1)


@pytest.mark.parametrize("dense_copy", [True, False])
def test_dense_copy_serves_batches(dense_copy: bool) -> None:
    """With the dense copy, calls from DENSE_COPY_ROWS rows on use it; without, no copy is held."""
    layer, weight = make_layer(128, 256, 64, bias=False)
    layer.prepare(dense_copy=dense_copy)
    assert (layer.dense is not None) == dense_copy
    assert layer.dense_copy_bytes() == (128 * 256 * dense_dtype("cpu").itemsize if dense_copy else 0)
    for rows in (DENSE_COPY_ROWS - 1, DENSE_COPY_ROWS, 32):
        check(layer, weight, rows)


def test_shapes_torch_cannot_pack_use_a_dense_copy() -> None:
    layer, weight = make_layer(40, 64, 32, bias=False)
    layer.prepare()
    assert layer.mode == "dense"
    check(layer, weight, 3)


def test_weight_bytes_under_a_third_of_fp16() -> None:
    layer, _ = make_layer(128, 256, 64, bias=False)
    layer.prepare()
    assert layer.weight_bytes() <= 128 * 256 * 2 * 0.3  # group 64: 4 bits + a bf16 (scale, zero) per 64 weights


def test_lm_head_copy_int8_rows_and_dense_batches() -> None:
    w = torch.randn(256, 64, generator=torch.Generator().manual_seed(5))
    head = LowBitHead(w, None)
    dt, last_int8 = dense_dtype("cpu"), head.int8_max_rows - 1
    scale = w.abs().amax(1, keepdim=True) / 127
    w8 = (w / scale).round().clamp(-127, 127) * scale.bfloat16().float()
    for rows, act, weight in ((1, torch.bfloat16, w8), (last_int8, torch.bfloat16, w8), (last_int8 + 1, dt, w.to(dt)),
                              (40, dt, w.to(dt))):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows))
        ref = x.to(act).float() @ weight.float().T
        err = ((head(x) - ref).abs().max() / ref.abs().max()).item()
        assert err < TOL, f"rows={rows}: relative error {err:.2e}"
    assert head.weight_bytes() == {"dense": 256 * 64 * dt.itemsize, "int8": 256 * 64 + 256 * 2}


def test_prepare_refuses_unloaded_layer() -> None:
    with torch.device("meta"):
        layer = Int4Linear(64, 64, 32, bias=False)
    with pytest.raises(ValueError):
        layer.prepare()


def test_cuda_path_glue() -> None:
    """The CUDA branch (AWQ tensors straight into kernels/triton/awq_gemm.py): compiled on a GPU, else run on the CPU
    by Triton's interpreter."""
    layer, weight = make_layer(64, 128, 32, bias=True)
    bias = layer.bias.data.clone()
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(9))
    ref = x.half().float() @ weight.T + bias
    if torch.cuda.is_available():
        layer = layer.to("cuda")
        layer.prepare()
        x = x.to("cuda")
    else:
        import kernels

        kernels.use_interpreter()
        layer.mode = "triton"  # what prepare() sets on a CUDA device
    assert layer.mode == "triton"
    y = layer(x).cpu()
    assert y.dtype == torch.float32
    assert ((y - ref).abs().max() / ref.abs().max()).item() < TOL
