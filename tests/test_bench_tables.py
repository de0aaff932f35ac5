"""bench/tables.py regenerates the docs' benchmark tables from result files; every result carries its provenance."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench import provenance, report, suite, tables

REPO = Path(__file__).resolve().parent.parent
PROV = {
    "date": "2030-01-02T03:04:05+00:00", "command": "python -m bench.throughput --quick", "mode": "quick",
    "machine": {"cpu": "Test CPU 9000", "cores": 4, "cores_usable": 4, "cpu_flags": ["avx2", "avx512_vnni"],
                "memory_gib": 16.0, "gpu": None, "os": "Linux"},
    "commit": {"sha": "0123456789abcdef0123456789abcdef01234567", "dirty": False},
    "versions": {"python": "3.11.7", "torch": "2.5.0"}, "load_avg_1m": {"start": 9.0, "end": 8.0},
}  # fmt: skip
THROUGHPUT = {
    "bench": "throughput", "engine_quantization": "awq", "new_tokens": 8,
    "engine_1": {"tok_s": 12.5, "ttft_p50_ms": 100.0, "itl_p50_ms": 50.0},
    "engine_4": {"tok_s": 40.0, "ttft_p50_ms": 300.0, "itl_p50_ms": 90.0},
    "hf": {"status": "measured"}, "hf_sequential": {"tok_s": 2.0},
    "peer": {"status": "absent", "how": "pass --llama-server PATH"},
    "provenance": PROV,
}  # fmt: skip
OVERHEAD = {
    "bench": "gateway_overhead",
    "c1": {"added_p50_ms": 0.5, "added_p99_ms": 2.0, "gateway_rps": 900.0, "gateway_stream_rps": 400.0},
    "provenance": {**PROV, "mode": "full", "load_avg_1m": {"start": 0.5, "end": 0.7},
                   "commit": {"sha": "fedcba9876543210fedcba9876543210fedcba98", "dirty": True}},
}  # fmt: skip
DOC = "# Benchmarks\n\nintro stays\n\n<!-- bench-results:start -->\nold table\n<!-- bench-results:end -->\n\ntail stays\n"
README = "# x\n\n<!-- bench-table:start -->\n| stale |\n<!-- bench-table:end -->\nafter\n"


def _setup(tmp_path: Path, results: dict[str, dict[str, Any]]) -> tuple[Path, Path, Path]:
    res = tmp_path / "bench" / "results"
    res.mkdir(parents=True)
    for name, r in results.items():
        (res / f"{name}.json").write_text(json.dumps(r))
    docs, readme = tmp_path / "docs" / "benchmarks.md", tmp_path / "README.md"
    docs.parent.mkdir()
    docs.write_text(DOC)
    readme.write_text(README)
    return res, docs, readme


def _block(text: str, mark: str) -> str:
    return text.split(f"<!-- {mark}:start -->")[1].split(f"<!-- {mark}:end -->")[0]


def test_tables_are_regenerated_between_the_markers(tmp_path: Path) -> None:
    res, docs, readme = _setup(tmp_path, {"throughput": THROUGHPUT, "gateway_overhead": OVERHEAD})
    written = tables.regenerate(res, docs, readme, tmp_path / "plots")
    assert set(written) == {docs, readme}

    text = docs.read_text()
    assert text.startswith("# Benchmarks\n\nintro stays\n") and text.endswith("\n\ntail stays\n")
    block = _block(text, "bench-results")
    assert "old table" not in block
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    assert rows, block
    for row in rows:  # every row cites its file, machine and commit
        assert re.search(r"\[(throughput|gateway_overhead)\.json\]\(\.\./bench/results/\1\.json\)", row), row
        assert "Test CPU 9000, 4 cores" in row
        assert "0123456789" in row or "fedcba9876-dirty" in row
    assert "| 12.5 |" in block and "| 40.0 |" in block and "| 2.0 |" in block
    assert "quick, loaded (9.0 on 4 cores)" in block  # a shared machine is said so
    assert "1 of these 2 results come from quick" in block and "1 were measured while the machine was shared" in block
    assert "llama.cpp's server" in block and "absent" in block  # a peer not run: absent, no figure
    assert "avx512_vnni" in block  # the machines list, in full
    assert "`cache`: not measured yet" in block  # the suite's benches without a result file

    small = _block(readme.read_text(), "bench-table")
    assert "| stale |" not in small and "[throughput.json](bench/results/throughput.json)" in small
    assert "0.5 / 2.00 ms" in small
    assert readme.read_text().endswith("<!-- bench-table:end -->\nafter\n")

    assert tables.regenerate(res, docs, readme, tmp_path / "plots") == []  # the same results: nothing changes


def test_a_file_without_markers_is_left_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res, docs, readme = _setup(tmp_path, {"throughput": THROUGHPUT})
    readme.write_text("# no markers here\n")
    assert tables.regenerate(res, docs, readme, tmp_path / "plots") == [docs]
    assert readme.read_text() == "# no markers here\n"
    assert "no <!-- bench-table:start -->" in capsys.readouterr().out


def test_no_results_says_so_and_types_nothing_in(tmp_path: Path) -> None:
    res, docs, readme = _setup(tmp_path, {})
    tables.regenerate(res, docs, readme, tmp_path / "plots")
    assert "No results yet" in _block(docs.read_text(), "bench-results")
    assert "not measured yet" in _block(readme.read_text(), "bench-table")


def test_a_summary_that_does_not_fit_falls_back_to_the_numbers() -> None:
    rows = tables.figures("kv_dtype", {"bench": "kv_dtype", "step_ms": 3.0, "provenance": PROV})  # no "engines"
    assert rows == [("step_ms", "3.0")]
    assert tables.figures("new_bench", {"bench": "new_bench", "tok_s": 7, "note": "x"}) == [("tok_s", "7")]


def test_emit_adds_provenance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.json"
    result = report.emit({"bench": "x", "figure": 1.5}, out)
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed == result == json.loads(out.read_text())
    prov = result["provenance"]
    for key in ("date", "command", "mode", "machine", "commit", "versions", "load_avg_1m"):
        assert key in prov, key
    for key in ("cpu", "cores", "cpu_flags", "memory_gib"):
        assert key in prov["machine"], key
    assert set(prov["commit"]) >= {"sha", "dirty"}
    assert prov["versions"]["python"] and "torch" in prov["versions"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", prov["date"])
    assert prov["command"].startswith("python")


def test_secrets_in_settings_are_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMOLGATE_API_KEYS", "sk-secret")
    monkeypatch.setenv("SMOLGATE_QUANTIZATION", "none")
    assert provenance.settings()["SMOLGATE_API_KEYS"] == "<set>"
    assert provenance.settings()["SMOLGATE_QUANTIZATION"] == "none"


def test_every_bench_writes_through_emit() -> None:
    """No bench writes its own result file or types a peer figure in: each ends with bench.report.emit."""
    for b in suite.SUITE:
        src = (REPO / "bench" / f"{b.name}.py").read_text()
        uses_emit = "emit(" in src or "run_and_report(" in src  # bench/server.py's run_and_report calls emit
        assert uses_emit, b.name
        assert "write_text(json" not in src, b.name
        assert not re.search(r"llama[_.]?cpp\w*\s*=\s*\d", src, re.IGNORECASE), b.name


def test_documented_flags_exist() -> None:
    """docs/benchmarks.md's flags per bench are the bench's own (a renamed flag fails here)."""
    text = (REPO / "docs" / "benchmarks.md").read_text()
    sections = re.split(r"^### ", text.split("## The benchmarks", 1)[1], flags=re.MULTILINE)[1:]
    assert {s.split("\n", 1)[0].strip() for s in sections} == {b.name for b in suite.SUITE}
    for section in sections:
        name = section.split("\n", 1)[0].strip()
        src = (REPO / "bench" / f"{name}.py").read_text() + (REPO / "bench" / "peer.py").read_text()
        for flag in set(re.findall(r"`(--[a-z][a-z0-9-]*)", section)):
            assert f'"{flag}"' in src, f"{name}: {flag}"


def test_the_suite_passes_peers_to_the_benches_that_measure_them() -> None:
    args = suite.parse_args(["--quick", "--only", "throughput,cache_pairs", "--llama-server", "/opt/llama-server"])
    assert [b.name for b in args.benches] == ["throughput", "cache_pairs"] and args.timeout == suite.QUICK_TIMEOUT_S
    extra = suite.peer_args(args)
    assert extra == ["--llama-server", "/opt/llama-server"]
    assert {b.name for b in suite.SUITE if b.peer} == {"throughput", "prefill", "peer_agreement"}
    assert "--quick" in suite.BY_NAME["throughput"].argv(quick=True)
    assert [b.name for b in suite.parse_args(["--skip", "soak"]).benches] == [b.name for b in suite.SUITE if b.name != "soak"]
    with pytest.raises(SystemExit):
        suite.parse_args(["--only", "no_such_bench"])
