"""`python -m bench.prefill`: time to first token over HTTP from a real gateway, a peer measured in the same run (never
typed in), the prompts unique so no cache serves them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import prefill
from tests.gateway_fixtures import API_KEY, LiveStack, live  # noqa: F401  (the session's live server)


def test_prompts_share_no_prefix() -> None:
    prompts = prefill.unique_prompts([16, 64], reps=3)
    assert [len(p) for p in prompts] == [16, 64] * 4
    assert len({p[0] for p in prompts}) == len(prompts)  # no first token twice: no shared prefix at all
    assert all(prefill.TOKEN_RANGE[0] <= t < prefill.TOKEN_RANGE[1] for p in prompts for t in p)


def test_a_fresh_gateway_is_measured_and_the_peer_is_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "prefill.json"
    prefill.main(["--lengths", "16,40", "--reps", "1", "--quantization", "none", "--out", str(out)])

    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["bench"] == "prefill" and json.loads(out.read_text()) == result
    assert result["ours"] == {"server": "python -m gateway", "quantization": "none"}
    assert result["peer"]["status"] == "absent"
    for n, row in result["lengths"].items():
        assert set(row) == {"ours"}  # no peer figures, no ratio
        ours = row["ours"]
        assert ours["prompt_tokens"] == int(n) and ours["cached_tokens"] == 0  # the server computed every token
        assert ours["ttft_p50_ms"] > 0 and len(ours["ttft_ms"]) == 1


def test_a_peer_is_measured_in_the_same_run(live: LiveStack, tmp_path: Path) -> None:  # noqa: F811
    # Any OpenAI-compatible server can be either side: here the live gateway is both, each with its own key.
    result = prefill.main(["--lengths", "24", "--reps", "2", "--url", live.url, "--api-key", API_KEY,
                           "--peer-url", live.url, "--peer-api-key", API_KEY, "--out", str(tmp_path / "p.json")])
    assert result["ours"] == {"server": live.url}
    assert result["peer"] == {"status": "measured", "peer": "OpenAI-compatible server", "url": live.url}
    row = result["lengths"]["24"]
    assert row["ours"]["prompt_tokens"] == row["peer"]["prompt_tokens"] == 24  # the same ids reached both sides
    assert len(row["ours"]["ttft_ms"]) == len(row["peer"]["ttft_ms"]) == 2
    assert row["ratio_ours_over_peer"] == pytest.approx(row["ours"]["ttft_p50_ms"] / row["peer"]["ttft_p50_ms"], 1e-2)
    pairs = [a / b for a, b in zip(row["ours"]["ttft_ms"], row["peer"]["ttft_ms"], strict=True)]
    assert row["ratio_paired_p50"] == pytest.approx(sum(pairs) / 2, rel=1e-2)  # two rounds: the median is the mean


@pytest.mark.skipif(not os.environ.get("LLAMA_SERVER"), reason="set LLAMA_SERVER to a llama-server binary")
def test_llama_server_is_measured(tmp_path: Path) -> None:
    """llama.cpp's own server as the peer, on the shipped GGUF: it counts the same prompt tokens, none cached."""
    result = prefill.main(["--lengths", "32", "--reps", "1", "--quantization", "none",
                           "--llama-server", os.environ["LLAMA_SERVER"], "--out", str(tmp_path / "p.json")])
    assert result["peer"]["peer"] == "llama-server" and result["peer"]["status"] == "measured"
    row = result["lengths"]["32"]
    assert row["ours"]["prompt_tokens"] == row["peer"]["prompt_tokens"] == 32
    assert row["ours"]["cached_tokens"] == row["peer"]["cached_tokens"] == 0
