"""The composition root: `python -m gateway` builds the real engine, serves, and stops on SIGTERM."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest

from bench.server import free_port, wait_ready
from gateway.ops.access_log import OWN_LOGGERS, make_logger, route_stdlib_logging

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
    # the engine's stdlib record and uvicorn's reach the operator in the gateway's own format
    ready = next(r for r in records if r.get("event") == "ready")
    loaded = next(r for r in records if r.get("logger") == "backend.engine.llm_engine")
    assert "loaded on cpu" in loaded["event"] and loaded["level"] == ready["level"] == "info"
    assert all(r["timestamp"].endswith("Z") for r in (ready, loaded))
    assert any(r.get("event") == "Application shutdown complete." and r.get("logger") == "uvicorn.error" for r in records)


@pytest.fixture
def root_logging() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in ("", *OWN_LOGGERS)]
    handlers, levels = list(loggers[0].handlers), [lg.level for lg in loggers]
    yield
    loggers[0].handlers[:] = handlers
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


@pytest.mark.usefixtures("root_logging")
def test_stdlib_records_share_the_gateway_format_and_redaction() -> None:
    """A backend record (standard library logging, no gateway import) renders through the gateway's processors to the
    same stream: the same keys, level names and timestamps, secrets redacted, tracebacks included; below the level
    nothing is written (a library's info line neither), and a second setup replaces the first handler instead of doubling
    every line."""
    secret = "sk-operator-secret-123456"
    first = io.StringIO()
    route_stdlib_logging(first, "info", (secret,))
    sink = io.StringIO()
    route_stdlib_logging(sink, "info", (secret,))
    backend = logging.getLogger("backend.engine.async_engine")
    backend.debug("not at info")
    logging.getLogger("httpx").info("HTTP Request: POST http://upstream/v1/chat/completions")  # every request: too chatty
    backend.warning("upstream said %s", f"bad key {secret}")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        backend.exception("engine step failed")
    make_logger(sink, "info", (secret,)).warning("upstream said", detail=f"bad key {secret}")
    lines = sink.getvalue().splitlines()
    assert first.getvalue() == "" and len(lines) == 3 and secret not in sink.getvalue()
    warned, failed, gateway = (json.loads(line) for line in lines)
    assert warned == {"event": "upstream said bad key [redacted]", "logger": "backend.engine.async_engine",
                      "level": "warning", "timestamp": warned["timestamp"]}
    assert gateway.keys() - {"detail"} == warned.keys() - {"logger"} and gateway["level"] == "warning"
    for record in (warned, gateway):
        assert datetime.fromisoformat(record["timestamp"]).tzinfo == UTC
    assert failed["level"] == "error" and 'RuntimeError: boom' in failed["exception"]
