"""Fixtures for the response-cache tests: a real redis-server on a free port, and the real engine +
embedder behind live uvicorn servers — one with the in-process cache, two Redis replicas sharing one
server, and one whose Redis is down (a port where nothing listens: every call fails for real).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import API_KEY, AppServers, gateway_test_config

from gateway.app import build_context, create_app
from gateway.cache.config import CacheConfig
from gateway.cache.stores import MemoryStore
from gateway.context import GatewayContext

OTHER_KEY = "sk-test-other-tenant"
REDIS_SKIP = "redis-server is not installed (make test installs it with apt-get when it can)"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    url: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def start_redis(port: int | None = None) -> RedisServer | None:
    """A redis-server on `port` (a free one by default; the same one again simulates a restart)."""
    binary = shutil.which("redis-server")
    if binary is None:
        return None
    port = port or free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return RedisServer(f"redis://127.0.0.1:{port}/0", process)
        except OSError:
            time.sleep(0.05)
    process.terminate()
    raise RuntimeError("redis-server did not start")


class RecordingStore(MemoryStore):
    """The in-process store, keeping every question's vector as handed to it (which embedder made it is a test's
    question)."""

    def __init__(self, max_entries: int) -> None:
        super().__init__(max_entries)
        self.vectors: dict[str, list[float]] = {}

    async def add_vector(self, scope: str, key: str, text: str, vector: list[float], ttl_s: int) -> None:
        self.vectors[text] = vector
        await super().add_vector(scope, key, text, vector, ttl_s=ttl_s)


@dataclass
class CacheStack:
    """name -> live server URL: memory, redis1, redis2 (replicas), redis_down. The embedders are built as
    `python -m gateway` builds them (the cache's own int8 copy where the C kernels build)."""

    log_path: Path
    redis: RedisServer | None
    urls: dict[str, str] = field(default_factory=dict)
    contexts: dict[str, GatewayContext] = field(default_factory=dict)
    memory_store: RecordingStore | None = None
    _servers: AppServers = field(default_factory=AppServers)

    def client(self, name: str = "memory", key: str = API_KEY) -> openai.OpenAI:
        if name not in self.urls:
            pytest.skip(REDIS_SKIP)
        return openai.OpenAI(base_url=f"{self.urls[name]}/v1", api_key=key, max_retries=0, timeout=120)

    @contextmanager
    def configured(self, name: str = "memory", **changes: Any) -> Iterator[None]:
        """Run with some `cache:` settings changed on one server (read per request), restored after."""
        cache = self.contexts[name].cache
        saved = cache.cfg
        cache.cfg = replace(saved, **changes)
        try:
            yield
        finally:
            cache.cfg = saved

    def metrics(self, name: str) -> str:
        return httpx.get(f"{self.urls[name]}/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text

    def metric(self, name: str, series: str) -> float:
        """One sample's value from /metrics (0 when absent)."""
        for line in self.metrics(name).splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        return 0.0

    def log_lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]

    def log_of(self, request_id: str, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            lines = [x for x in self.log_lines() if x.get("request_id") == request_id and x.get("event") == "request"]
            if lines or time.monotonic() > deadline:
                assert lines, f"no log line for {request_id}"
                return lines[0]
            time.sleep(0.02)

    def start(self) -> None:
        from backend.engine.async_engine import AsyncEngine
        from gateway.__main__ import build_embedders

        base = gateway_test_config()
        base = replace(base, api_keys=(API_KEY, OTHER_KEY), cache=CacheConfig(semantic=True))  # opted in
        configs = {"memory": base}
        if self.redis is not None:
            redis_cfg = CacheConfig(
                backend="redis", redis_url=self.redis.url, key_prefix=f"t{free_port()}", semantic=True
            )
            configs["redis1"] = configs["redis2"] = replace(base, cache=redis_cfg)
        dead_url = f"redis://127.0.0.1:{free_port()}/0"
        dead = CacheConfig(backend="redis", redis_url=dead_url, redis_retry_s=0.0, semantic=True)
        configs["redis_down"] = replace(base, cache=dead)
        engine = AsyncEngine.from_config(base.engine)
        embedder, cache_embedder = build_embedders(base, engine)
        log = self.log_path.open("a", buffering=1)
        self.memory_store = RecordingStore(base.cache.max_entries)
        for name, cfg in configs.items():
            store = self.memory_store if name == "memory" else None
            self.contexts[name] = build_context(cfg, engine, embedder, log, cache_store=store, cache_embedder=cache_embedder)
        apps = [create_app(ctx, manage_engine=(i == 0)) for i, ctx in enumerate(self.contexts.values())]
        self._serve(list(configs), apps)

    def _serve(self, names: list[str], apps: list[Any]) -> None:
        self.urls = dict(zip(names, self._servers.start(apps, "cache"), strict=True))

    def stop(self) -> None:
        self._servers.stop()


@cache
def _redis() -> RedisServer | None:
    return start_redis()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = _redis()
    if server is None:
        pytest.skip(REDIS_SKIP)
    yield server
    server.stop()


@cache
def _stack(log_dir: Path) -> CacheStack:
    stack = CacheStack(log_path=log_dir / "cache-gateway.log", redis=_redis())
    stack.start()
    return stack


@pytest.fixture(scope="session")
def cache_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CacheStack]:
    stack = _stack(tmp_path_factory.getbasetemp())
    yield stack
    stack.stop()
    if stack.redis is not None:
        stack.redis.stop()
