"""The small-M fp32 GEMM (kernels/cpu/small_gemm.c) against a float64 matmul, its batch invariance (a row's
result is the same bits at any M: what makes a speculative verify's logits equal plain decoding's), and
DualLinear's use of it. Skipped, saying why, where the kernel cannot be built."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from backend.quant.cpu_gemm import DualLinear
from kernels.cpu.small_gemm import MAX_ROWS, load_small_gemm, small_gemm, small_gemm_ref, supports
from tests.c_kernels import build, requires_c_kernels

pytestmark = requires_c_kernels


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory):
    return build(load_small_gemm, tmp_path_factory, "small_gemm")


@pytest.mark.parametrize("rows", range(1, MAX_ROWS + 1))
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float64_and_is_batch_invariant(lib, rows: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows)
    n, k = 37, 200  # 37 weight rows: two chunks of 16 and a tail
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g) if bias else None
    x = torch.randn(rows, k, generator=g)
    y = small_gemm(lib, x, w, b)
    torch.testing.assert_close(y, small_gemm_ref(x, w, b), atol=1e-4, rtol=1e-5)
    for m in range(rows):  # row m alone: the same bits
        assert torch.equal(small_gemm(lib, x[m : m + 1], w, b), y[m : m + 1])


def test_rows_may_be_strided(lib) -> None:
    g = torch.Generator().manual_seed(0)
    w, wide = torch.randn(24, 64, generator=g), torch.randn(3, 100, generator=g)
    x = wide[:, 10:74]  # (3, 64) rows 100 floats apart
    assert torch.equal(small_gemm(lib, x, w), small_gemm(lib, x.contiguous(), w))


def test_refuses_what_it_cannot_take(lib) -> None:
    assert not supports(torch.randn(8, 60)) and not supports(torch.randn(8, 64).bfloat16())
    with pytest.raises(AssertionError):
        small_gemm(lib, torch.randn(MAX_ROWS + 1, 64), torch.randn(8, 64))


def test_dual_linear_runs_it_up_to_max_rows(lib) -> None:
    lin = nn.Linear(64, 96)
    dual = DualLinear(lin, 1, lib)
    packed_rows: list[int] = []
    packed = dual.packed
    dual.packed = lambda x: packed_rows.append(x.shape[0]) or packed(x)  # type: ignore[assignment]
    with torch.inference_mode():
        for rows in (1, 5, MAX_ROWS, MAX_ROWS + 1):
            x = torch.randn(2, rows, 64)[1]  # a view: rows of a larger tensor
            torch.testing.assert_close(dual(x), lin(x), atol=1e-5, rtol=1e-5)
    assert packed_rows == [MAX_ROWS + 1]
