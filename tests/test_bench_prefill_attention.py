"""Smoke test of `python -m bench.prefill_attention`: a short run ends with one parseable JSON line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import prefill_attention
from tests.c_kernels import requires_c_kernels


@requires_c_kernels
def test_short_run_ends_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prefill_attention.json"
    prefill_attention.main(["--lengths", "20,40", "--reps", "1", "--quantization", "none", "--kernel-tokens", "300",
                             "--out", str(out)])

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "prefill_attention" and json.loads(out.read_text()) == result
    assert set(result["ttft"]) == {"20", "40"}
    assert all(row["per_token_ms"] > 0 and row["sdpa_ms"] > 0 for row in result["ttft"].values())
    # fp32 is not bit-invariant (its GEMM differs for <= 16 rows), so only the report's shape is checked here;
    # tests/test_batch_invariance.py checks the property on an INT4 model
    assert set(result["repeat_equal_logprobs"]) == {"per_token", "sdpa"}
    # the C kernel's tiled prefill entry against its decode entry token by token: the same attention to the bit
    kernel = result["kernel"]
    assert kernel["tokens"] == 300 and kernel["equal_to_the_bit"] and kernel["tiled_wall_ms"] > 0
