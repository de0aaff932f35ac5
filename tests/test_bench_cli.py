"""Every benchmark module imports and parses its command line: a moved or renamed import breaks `make bench`, which
the suite's other tests would not notice (they run a few benches only)."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest

import bench
from bench.registry import SUITE

MODULES = sorted(m.name for m in pkgutil.iter_modules(bench.__path__))
RUNNABLE = [name for name in MODULES if hasattr(importlib.import_module(f"bench.{name}"), "main")]


@pytest.mark.parametrize("name", RUNNABLE)
def test_bench_parses_help(name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    main = importlib.import_module(f"bench.{name}").main
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", "--help"])  # what `python -m bench.NAME --help` passes
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_suite_members_are_runnable_modules() -> None:
    assert {b.name for b in SUITE} <= set(RUNNABLE)
