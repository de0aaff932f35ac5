"""bench/plots.py turns results JSON (in the shapes the benchmarks write) into PNG files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[test]')")

from bench.plots import plot_all

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _engine(tok_s: float) -> dict[str, float]:
    return {"tok_s": tok_s, "ttft_p50_ms": 300.0, "ttft_p99_ms": 400.0, "itl_p50_ms": 60.0, "itl_p99_ms": 140.0}


RESULTS = {
    "throughput": {
        "engine_quantization": "awq", "threads": 2, "new_tokens": 128, "device": "cpu",
        "engine_1": _engine(15.0), "engine_32": _engine(46.0), "hf_sequential": {"tok_s": 1.3},
        "peer": {"status": "measured", "peer": "llama-server"}, "peer_1": _engine(100.0), "peer_32": _engine(200.0),
    },
    "cache_pairs": {
        "pairs": 252, "default_threshold": 0.86,
        "sweep": [{"threshold": t, "paraphrase_hit_rate": 1.1 - t, "false_hit_rate": 0.9 - t} for t in (0.7, 0.8, 0.9)],
    },
    "awq": {
        "perplexity": {"fp32": 36.7, "rtn": 44.2, "awq": 41.4}, "cpus": 1,
        "decode_tok_s": {"fp32": {"1": 10.0}, "int4": {"1": 23.0}},
    },
    "overload": {
        "sustainable_rps": 0.7, "phase_s": 20.0, "lost_total": 0,
        "phases": [
            {"phase": "capacity", "offered_rps": 0.0, "answered_rps": 0.7, "rejected_429": 0,
             "latency_p50_s": 10.0, "latency_p99_s": 12.0, "latency_max_s": 12.0},
            {"phase": "4x", "offered_rps": 2.8, "answered_rps": 0.7, "rejected_429": 22,
             "latency_p50_s": 18.0, "latency_p99_s": 21.0, "latency_max_s": 22.0},
        ],
    },
    "soak": {"requests": 100, "unexpected_errors": 0, "leaked_kv_blocks": 0, "rss_samples_mb": [[0.0, 900.0], [60.0, 901.0]]},
}  # fmt: skip


def test_every_known_result_gets_a_png(tmp_path: Path) -> None:
    for name, result in RESULTS.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(result))
    out = tmp_path / "plots"
    written = plot_all(tmp_path, out)
    expected = {"throughput", "throughput_latency", "cache_pairs", "awq", "overload", "soak"}
    assert {p.stem for p in written} == expected
    for path in written:
        assert path.parent == out and path.read_bytes().startswith(PNG_MAGIC)


def test_no_results_no_plots(tmp_path: Path) -> None:
    assert plot_all(tmp_path, tmp_path) == []
