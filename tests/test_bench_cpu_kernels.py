"""Smoke test of `python -m bench.cpu_kernels`: a short run ends with one parseable JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import cpu_kernels
from kernels.cpu.build import avx512_available, c_kernels_unavailable, cpu_isa


def test_short_run_ends_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cpu_kernels.json"
    cpu_kernels.main(["--batches", "2", "--steps", "3", "--quantization", "none", "--ppl-tokens", "300",
                      "--out", str(out)])

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "cpu_kernels" and json.loads(out.read_text()) == result
    torch_row, c_row = result["engines"]["torch"], result["engines"]["c"]
    assert torch_row["ops"] == "torch" and c_row["ops"] == ("torch" if c_kernels_unavailable() else "cpu")
    assert torch_row["kv_dtype"] == c_row["kv_dtype"] == "float32"  # full precision keeps the model's dtype
    # the same weights, and the decode attention paths agree closely enough for nearly the same perplexity
    assert abs(torch_row["perplexity"] - c_row["perplexity"]) / torch_row["perplexity"] < 1e-3
    assert torch_row["step_ms_b2"] > 0 and c_row["step_ms_b2"] > 0 and result["speedup"]["step_ms_b2"] > 0
    assert result["engines"]["c-layers"]["step_ms_b2"] > 0 and result["decode_stack_speedup"]["step_ms_b2"] > 0
    assert c_row["gemm_isa"] == (None if c_kernels_unavailable() else cpu_isa())
    if avx512_available() and not c_kernels_unavailable():  # the AVX2 GEMMs beside them, in the same run
        assert result["engines"]["c-avx2"]["gemm_isa"] == "avx2" and result["isa_speedup"]["step_ms_b2"] > 0
