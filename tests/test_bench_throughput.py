"""Smoke test of `python -m bench.throughput`: a --quick run ends with one parseable JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import throughput


def test_quick_run_ends_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "throughput.json"
    throughput.main(["--quick", "--quantization", "none", "--out", str(out)])

    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads(last_line)
    assert result["bench"] == "throughput"
    assert json.loads(out.read_text()) == result
    engines = [v for k, v in result.items() if k.startswith("engine_") and isinstance(v, dict)]
    assert len(engines) == 2  # --quick: 1 and 4 streams
    for figures in [*engines, result["hf_sequential"]]:
        assert figures["tok_s"] > 0
    for figures in engines:
        assert figures["tokens"] == figures["requests"] * result["new_tokens"]
        assert figures["ttft_p50_ms"] > 0 and figures["itl_p50_ms"] > 0
    assert result["ratio_1_vs_hf"] > 0 and result["ratio_1_vs_llama_cpp"] > 0
