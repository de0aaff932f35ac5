"""The W8A8 CPU kernel (kernels/cpu_w8a8.c) against its torch reference and a float32 matmul, and LowBitHead with it.
Skipped, saying why, where the C kernels cannot be built (not x86 AVX2, no C compiler)."""

from __future__ import annotations

import pytest
import torch

from backend.quant.lm_head import LowBitHead
from kernels.cpu_w8a8 import load_w8a8, pack_w8a8, w8a8_group, w8a8_linear, w8a8_linear_ref
from tests.c_kernels import build, requires_c_kernels

pytestmark = requires_c_kernels


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory):
    return build(load_w8a8, tmp_path_factory, "w8a8")


@pytest.mark.parametrize(("n", "k"), [(40, 576), (17, 544), (64, 128)])  # groups of 64, of 32; odd rows
@pytest.mark.parametrize("rows", [1, 4, 6, 33])
def test_matches_reference_and_float_matmul(lib, n: int, k: int, rows: int) -> None:
    g = torch.Generator().manual_seed(n + rows)
    weight = torch.randn(n, k, generator=g) * 0.05
    weight[0, 0] = -weight.abs().max() * 3  # the most negative value maps to -127 (sign handling)
    w = pack_w8a8(weight)
    assert w.group_size == w8a8_group(k) and w.q.min().item() == -127
    x = torch.randn(rows, k, generator=g)
    y = w8a8_linear(lib, x, w)
    ref = w8a8_linear_ref(x, w)
    assert y.shape == (rows, n)
    assert ((y - ref).abs().max() / ref.abs().max()).item() < 1e-5
    exact = x @ weight.T
    assert ((y - exact).norm() / exact.norm()).item() < 0.02


def test_a_row_does_not_depend_on_its_batch(lib) -> None:
    w = pack_w8a8(torch.randn(48, 256))
    x = torch.randn(37, 256)
    full = w8a8_linear(lib, x, w)
    for rows in (slice(5, 6), slice(0, 4), slice(3, 36)):
        assert torch.equal(w8a8_linear(lib, x[rows], w), full[rows])


def test_shapes_it_cannot_take() -> None:
    assert w8a8_group(100) == 0
    with pytest.raises(AssertionError, match="multiple of 32"):
        pack_w8a8(torch.randn(4, 100))


@pytest.mark.parametrize("rows", [1, 32])
def test_lm_head_with_the_kernel_keeps_only_int8_rows(lib, rows: int) -> None:
    weight, bias = torch.randn(300, 128) * 0.05, torch.randn(300)
    head = LowBitHead(weight, bias, lib)
    assert head.w8a8_lib is not None and not hasattr(head, "dense")
    assert head.weight_bytes() == {"int8": 300 * 128 + 300 * 4}
    x = torch.randn(rows, 128)
    ref = x @ weight.T + bias
    assert ((head(x) - ref).norm() / ref.norm()).item() < 0.02
    assert LowBitHead(torch.randn(10, 100), None, lib).w8a8_lib is None  # K not a multiple of 32: torch's path
