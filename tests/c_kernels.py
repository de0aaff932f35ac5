"""What the C kernels' tests share: skip where they cannot be built, build each into a test folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

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
