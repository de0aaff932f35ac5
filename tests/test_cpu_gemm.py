"""PackedLinear (oneDNN-prepacked weights) computes what F.linear computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from backend.quant.cpu_gemm import DualLinear, HalfWeightLinear, PackedLinear, half_weight_gemm_available, onednn_available


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 4, 33])
def test_matches_f_linear(dtype: torch.dtype, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 64, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    x = torch.randn(rows, 64, generator=g).to(dtype)
    layer = PackedLinear(w, b)
    assert layer.packed == onednn_available(dtype)
    ref = F.linear(x, w, b)
    tol = 1e-5 if dtype == torch.float32 else 0.0  # bf16: the same oneDNN kernel, bit for bit
    torch.testing.assert_close(layer(x), ref, atol=tol * 10 * ref.abs().max().item(), rtol=tol)
    torch.testing.assert_close(layer(x, activation="gelu"), F.gelu(ref), atol=0.02 if tol == 0 else 1e-4, rtol=0.01)


def test_batched_input_and_no_bias() -> None:
    w = torch.randn(48, 32)
    x = torch.randn(2, 5, 32)
    y = PackedLinear(w)(x)
    assert y.shape == (2, 5, 48)
    torch.testing.assert_close(y, x @ w.T, atol=1e-4, rtol=1e-5)


def test_cpu_without_onednn_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    w, x = torch.randn(8, 16), torch.randn(3, 16)
    layer = PackedLinear(w)
    assert not layer.packed and layer.nbytes() == 8 * 16 * 4
    torch.testing.assert_close(layer(x, activation="gelu"), F.gelu(x @ w.T))


@pytest.mark.skipif(not half_weight_gemm_available(), reason="torch built without FBGEMM")
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 64)])
def test_half_weight_linear_is_fp32_arithmetic_on_fp16_weights(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(shape))
    w, b, x = torch.randn(96, 64, generator=g), torch.randn(96, generator=g), torch.randn(*shape, generator=g)
    layer = HalfWeightLinear(w, b)
    ref = F.linear(x, w.half().float(), b)
    assert layer.nbytes() == 96 * 64 * 2
    torch.testing.assert_close(layer(x), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(layer(x, activation="gelu"), F.gelu(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("min_rows", [1, 2])
def test_dual_linear_uses_the_packed_copy_from_min_rows(min_rows: int) -> None:
    """min_rows 2 (Intel: MKL's GEMV wins at one row) or 1 (elsewhere); every path computes nn.Linear's result."""
    lin = nn.Linear(64, 96)
    dual = DualLinear(lin, min_rows)
    packed_rows: list[int] = []
    packed = dual.packed
    dual.packed = lambda x: packed_rows.append(x.shape[0]) or packed(x)  # type: ignore[assignment]
    for rows in (1, 2, 5):
        x = torch.randn(rows, 64)
        torch.testing.assert_close(dual(x), lin(x), atol=1e-5, rtol=1e-5)
    assert packed_rows == [r for r in (1, 2, 5) if r >= min_rows]


def test_bench_gemm_row_times_every_variant() -> None:
    """bench.gemm's micro row: every variant runs on the shape and gets a positive time."""
    from bench.gemm import shape_row

    row = shape_row("tiny", torch.randn(64, 128), rows=3)
    assert row["shape"] == "tiny" and row["rows"] == 3
    assert {"fp32_linear", "fp32_packed", "bf16_linear", "bf16_packed", "int4"} <= row.keys()
    assert all(row[k] > 0 for k in row if k not in ("shape", "rows"))
