"""What the C kernels' tests share: skip where they cannot be built, build each into a test folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kernels.cpu.build import c_kernels_unavailable

requires_c_kernels = pytest.mark.skipif(c_kernels_unavailable() is not None, reason=f"C kernels: {c_kernels_unavailable()}")


def build(loader: Callable[[Path], object], tmp_path_factory: pytest.TempPathFactory, name: str) -> object:
    """The kernel `loader` builds into a fresh folder (a clean build, not the user's cache)."""
    folder = Path(tmp_path_factory.mktemp(name))
    built = loader(folder)
    assert built is not None, f"the kernel did not build (see the .log in {folder})"
    return built
