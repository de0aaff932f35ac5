"""docs/architecture.md names real things: every file or folder it writes as a path exists, and the walk of one
request (HTTP to the kernels and back) names a file at each step, in the order the request meets them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"`((?:gateway|backend|kernels|bench|tests|deploy|docs)/[\w./-]*)`")


def _walk() -> str:
    text = DOC.read_text()
    return text.split("## One request, end to end", 1)[1].split("\n## ", 1)[0]


def test_every_path_the_doc_names_exists() -> None:
    named = PATH.findall(DOC.read_text())
    assert len(named) > 20, "the architecture page names the files it describes"
    missing = sorted({p for p in named if not (ROOT / p.rstrip("/")).exists()})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_walk_names_a_file_at_every_step() -> None:
    steps = re.findall(r"^\d+\. (.+?)(?=^\d+\. |\Z)", _walk(), flags=re.M | re.S)
    assert len(steps) >= 5, "the walk goes HTTP -> parsing -> engine -> kernels -> back, one step each"
    for step in steps:
        assert PATH.search(step), f"a step of the walk names no file by its path: {step[:80]!r}"
    files = [p for step in steps for p in PATH.findall(step)]
    assert any(p.startswith("kernels/") for p in files), "the walk reaches the kernels"
    first_gateway = next(i for i, p in enumerate(files) if p.startswith("gateway/"))
    first_kernel = next(i for i, p in enumerate(files) if p.startswith("kernels/"))
    assert first_gateway < first_kernel, "the walk starts at the HTTP side"
