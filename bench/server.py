"""A real `python -m gateway` in a subprocess, for the benchmarks and tests that need a whole server
(its own process to signal, its own RSS): soak, overload, the shutdown test."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.report import emit

ROOT = Path(__file__).resolve().parents[1]

# A small server: no embedder (the semantic cache is off without it), a short context, a small KV pool.
SMALL_SERVER_ENV = {
    "SMOLGATE_EMBEDDINGS": "false",
    "SMOLGATE_MAX_MODEL_LEN": "1024",
    "SMOLGATE_KV_CACHE_MEMORY_MB": "128",
    "SMOLGATE_API_KEYS": "",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout_s: float = 20) -> None:
    """SIGTERM every process still running (the graceful shutdown), then wait for each; kill one that overstays."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 300, log: Path | None = None, *,
               path: str = "/ready") -> None:
    """Poll `url` + `path` (the gateway's /ready; llama-server's is /health) until it answers 200; fail early (with the
    log's tail) if the process exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(f"{url}: the process exited early\n{tail}")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} did not become ready")


@dataclass
class GatewayProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path  # stderr (uvicorn and the access log) goes to a file: a full pipe would stall the server

    @classmethod
    def start(cls, env: dict[str, str], timeout_s: float = 240.0) -> GatewayProcess:
        port = free_port()
        log = tempfile.NamedTemporaryFile(prefix="smolgate-", suffix=".log", delete=False)  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        server = cls(f"http://127.0.0.1:{port}", proc, Path(log.name))
        try:
            server.wait_ready(timeout_s)
        except BaseException:
            server.kill()
            raise
        return server

    def wait_ready(self, timeout_s: float) -> None:
        wait_ready(self.url, self.proc, timeout_s, self.log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """SIGTERM: the graceful shutdown (README: Operations)."""
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log_path.unlink(missing_ok=True)


def run_and_report(
    url: str | None, env: dict[str, str], work: Callable[[str], Awaitable[dict[str, Any]]], out: Path
) -> dict[str, Any]:
    """Run `work(url)` against `url`, or against a `python -m gateway` started with `env` when url is None;
    add the load average, write the result (with its provenance) to `out` and print it as the last line."""
    server = None if url else GatewayProcess.start(env)
    try:
        result = asyncio.run(work(url or server.url))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.kill()
    result["load"] = os.getloadavg()
    result.setdefault("bench", out.stem)
    return emit(result, out)
