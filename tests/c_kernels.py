"""What the C kernels' tests share: skip where they cannot be built, build each into a test folder."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import torch

from kernels.cpu.build import avx512_available, c_kernels_unavailable

requires_c_kernels = pytest.mark.skipif(c_kernels_unavailable() is not None, reason=f"C kernels: {c_kernels_unavailable()}")
requires_avx512 = pytest.mark.skipif(not avx512_available(), reason="the CPU lacks AVX-512 F/BW/VL + VNNI")
# The instruction sets of the dispatching kernels (w4a8, w8a8): a fixture params=ISAS tests each this CPU runs.
ISAS = [pytest.param("avx2", id="avx2"), pytest.param("avx512", id="avx512", marks=requires_avx512)]


def build(loader: Callable[[Path], object], tmp_path_factory: pytest.TempPathFactory, name: str) -> object:
    """The kernel `loader` builds into a fresh folder (a clean build, not the user's cache)."""
    folder = Path(tmp_path_factory.mktemp(name))
    built = loader(folder)
    assert built is not None, f"the kernel did not build (see the .log in {folder})"
    return built


def assert_rows_invariant_on_every_isa(
    load: Callable[..., object], linear: Callable[[object, torch.Tensor, object], torch.Tensor], w: object,
    x: torch.Tensor, tmp_path_factory: pytest.TempPathFactory, name: str,
) -> None:
    """On each instruction set this CPU runs, every row of `linear(lib, x, w)` equals the row computed in other batches
    (alone, in the first 4-row tile, across tiles and 32-row blocks, the last), bit for bit; and every instruction set
    gives the same bits. `load(folder, isa=...)` builds the kernel."""
    outs = []
    for isa in ["avx2", "avx512"] if avx512_available() else ["avx2"]:
        lib = build(partial(load, isa=isa), tmp_path_factory, f"{name}-{isa}")
        full = linear(lib, x, w)
        for part in (slice(5, 6), slice(0, 4), slice(3, 36), slice(0, 33), slice(37, 38)):
            assert torch.equal(linear(lib, x[part], w), full[part]), (isa, part)
        outs.append(full)
    assert all(torch.equal(o, outs[0]) for o in outs)
