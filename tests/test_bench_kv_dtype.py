"""Smoke test of `python -m bench.kv_dtype`: a short run ends with one parseable JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import kv_dtype


def test_short_run_ends_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "kv_dtype.json"
    kv_dtype.main(["--batch", "2", "--steps", "3", "--quantization", "none", "--out", str(out)])

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "kv_dtype" and json.loads(out.read_text()) == result
    fp32, bf16 = result["engines"]["float32"], result["engines"]["bfloat16"]
    assert (fp32["kv_dtype"], bf16["kv_dtype"]) == ("float32", "bfloat16")
    assert bf16["kv_blocks"] == 2 * fp32["kv_blocks"]  # same budget, half the bytes per block
    assert fp32["step_ms_p50"] > 0 and bf16["step_ms_p50"] > 0 and result["step_time_ratio"] > 0
