"""The composition root: `python -m gateway` builds the real engine, serves, and stops on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import openai

from bench.server import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[1]


def test_python_m_gateway_serves_and_stops_cleanly() -> None:
    port = free_port()
    env = {
        **os.environ,
        "PORT": "1",  # the --port flag wins over the environment
        "SMOLGATE_API_KEYS": "",
        "SMOLGATE_EMBEDDINGS": "false",
        "SMOLGATE_KV_CACHE_MEMORY_MB": "64",
        "SMOLGATE_MAX_MODEL_LEN": "512",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=180.0)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="no-key-needed", max_retries=0)
        resp = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert resp.choices[0].message.content is not None
        assert "all-MiniLM-L6-v2" not in {m.id for m in client.models.list()}
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM), stderr[-2000:]  # uvicorn re-raises the signal
    assert "Application shutdown complete" in stderr
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert any(r.get("event") == "request" and r.get("route") == "/v1/chat/completions" for r in records)
