"""kernels/cpu/build.py's compile step says what a first start waits for, and where a failed build's error went."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kernels.cpu import build

KERNELS = Path(build.__file__).parent


@pytest.mark.skipif(build.c_kernels_unavailable() is not None, reason="no C kernels on this machine")
def test_a_build_logs_the_kernel_and_its_time_and_a_failed_one_its_log(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=build.__name__)
    target = tmp_path / "elementwise-test.so"
    assert build._build(KERNELS / "elementwise.c", target, build.FLAGS, build._torch_openmp())
    assert target.exists()
    assert f"compiling C kernel elementwise.c for this CPU (once; kept in {tmp_path})" in caplog.text
    assert "compiled elementwise.c in " in caplog.text

    broken = tmp_path / "broken.c"
    broken.write_text("int f(void) { return }\n")
    assert not build._build(broken, tmp_path / "broken-test.so", build.FLAGS, None)
    assert f"C kernel broken.c did not compile: {tmp_path / 'broken.log'} says why" in caplog.text
    assert "error" in (tmp_path / "broken.log").read_text()
    assert not list(tmp_path.glob("broken*.so")) and not list(tmp_path.glob("tmp*.so"))  # no half-built library left
