"""`python -m bench.throughput`: a --quick run ends with one parseable JSON line; a peer is measured, never typed in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import throughput
from tests.gateway_fixtures import API_KEY, LiveStack, live  # noqa: F401  (the session's live server)


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
    assert result["ratio_1_vs_hf"] > 0
    assert result["peer"]["status"] == "absent" and not any(k.startswith(("peer_", "ratio_1_vs_peer")) for k in result)


def test_a_peer_is_measured_in_the_same_run(live: LiveStack, tmp_path: Path) -> None:  # noqa: F811
    # Any OpenAI-compatible server can be the peer: here the gateway itself, streaming /v1/completions over HTTP.
    result = throughput.main(["--quick", "--quantization", "none", "--streams", "2", "--out", str(tmp_path / "t.json"),
                              "--peer-url", live.url, "--peer-api-key", API_KEY])
    assert result["peer"] == {"status": "measured", "peer": "OpenAI-compatible server", "url": live.url}
    figures = result["peer_2"]
    assert figures["tokens"] == figures["requests"] * result["new_tokens"] and figures["tok_s"] > 0
    assert figures["ttft_p50_ms"] > 0 and figures["itl_p50_ms"] > 0
    assert result["ratio_2_vs_peer"] == pytest.approx(result["engine_2"]["tok_s"] / figures["tok_s"], rel=1e-2)
