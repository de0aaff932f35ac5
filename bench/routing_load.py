"""Load generation for bench.routing: closed-loop chat requests at a fixed concurrency, and the httpx pool test."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.server import free_port, wait_ready

MODEL = "SmolLM2-135M-Instruct"
TOPICS = ["rivers", "volcanoes", "owls", "bread", "comets", "glaciers", "violins", "bridges", "tea", "maps", "bees", "clocks"]


@dataclass(frozen=True)
class Result:
    start: float
    end: float
    ok: bool
    tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class Load:
    requests: int
    concurrency: int
    max_tokens: int

    @staticmethod
    def summary(results: list[Result]) -> dict[str, Any]:
        wall = max(r.end for r in results) - min(r.start for r in results)
        tokens = sum(r.tokens for r in results)
        lat = sorted(r.end - r.start for r in results)
        return {"requests": len(results), "failed": sum(not r.ok for r in results), "wall_s": round(wall, 2),
                "tok_s": round(tokens / wall, 1), "req_s": round(len(results) / wall, 2),
                "p50_s": round(lat[len(lat) // 2], 2)}  # fmt: skip


async def run_load(url: str, load: Load, tag: str = "", duration_s: float | None = None) -> list[Result]:
    """`load.requests` requests (or as many as fit in duration_s), `load.concurrency` at a time."""
    counter = itertools.count()
    results: list[Result] = []
    stop_at = time.perf_counter() + duration_s if duration_s else None

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            i = next(counter)
            if i >= load.requests or (stop_at and time.perf_counter() >= stop_at):
                return
            topic = TOPICS[i % len(TOPICS)]
            body = {"model": MODEL, "max_tokens": load.max_tokens, "temperature": 0,
                    "messages": [{"role": "user", "content": f"Tell me a fact about {topic} ({tag}{i})."}]}  # fmt: skip
            start = time.perf_counter()
            try:
                r = await client.post(f"{url}/v1/chat/completions", json=body)
                ok = r.status_code == 200
                tokens = r.json()["usage"]["completion_tokens"] if ok else 0
                results.append(Result(start, time.perf_counter(), ok, tokens, "" if ok else str(r.status_code)))
            except httpx.HTTPError as exc:
                results.append(Result(start, time.perf_counter(), False, 0, type(exc).__name__))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=load.concurrency)) as client:
        await asyncio.gather(*(worker(client) for _ in range(load.concurrency)))
    return results


def echo_app() -> Any:
    """A fast OpenAI-shaped upstream (a canned chat.completion) for the HTTP pool measurement."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    canned = (b'{"id":"x","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
              b'"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
              b'"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')  # fmt: skip

    async def chat(request: Any) -> Response:
        await request.body()
        return Response(canned, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


async def _pool_rate(clients: list[list[httpx.AsyncClient]], urls: list[str], total: int, in_flight: int) -> float:
    """clients[k]: the clients (shards) for urls[k], taken in turn."""
    counter = itertools.count()
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'

    async def worker() -> None:
        while (i := next(counter)) < total:
            k = i % len(urls)
            shards = clients[k]
            client = shards[(i // len(urls)) % len(shards)]
            (await client.post(f"{urls[k]}/v1/chat/completions", content=body)).raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return round(total / (time.perf_counter() - started), 1)


async def http_pool(total: int = 1000, in_flight: int = 64) -> dict[str, float]:
    """Requests/s with `in_flight` concurrent requests over two fast upstreams: httpx per pool layout, and
    through a routing gateway (one subprocess, two deployments) against going straight to the upstreams."""
    ports = [free_port(), free_port()]
    procs = [subprocess.Popen([sys.executable, "-m", "bench.routing", "--serve-echo", str(p)]) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        for url, proc in zip(urls, procs, strict=True):
            _wait_echo(url, proc)
        layouts = {  # (shared by both upstreams?, shards per upstream, connections per shard)
            "shared_client_128": (True, 1, 128),
            "client_per_deployment_64": (False, 1, 64),
            "sharded_4x16_per_deployment": (False, 4, 16),
            "client_per_deployment_8": (False, 1, 8),
        }
        out: dict[str, float] = {}
        for _ in range(2):  # two passes, best of: the machine is shared
            for name, (shared, shards, size) in layouts.items():
                out[name] = max(out.get(name, 0.0), await _with_clients(shared, shards, size, urls, total=total,
                    in_flight=in_flight))
        gw_port = free_port()
        procs.append(_router_process(gw_port, urls))
        wait_ready(f"http://127.0.0.1:{gw_port}", procs[-1])
        for _ in range(2):
            out["through_router"] = max(
                out.get("through_router", 0.0),
                await _with_clients(True, 4, 16, [f"http://127.0.0.1:{gw_port}"], total=total, in_flight=in_flight),
            )
        return out
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


async def _with_clients(shared: bool, shards: int, size: int, urls: list[str], *, total: int, in_flight: int) -> float:
    def make() -> list[httpx.AsyncClient]:
        return [
            httpx.AsyncClient(limits=httpx.Limits(max_connections=size, max_keepalive_connections=size)) for _ in range(shards)
        ]

    one = make()
    clients = [one if shared else make() for _ in urls]
    try:
        return await _pool_rate(clients, urls, total, in_flight)
    finally:
        for c in {id(c): c for row in clients for c in row}.values():
            await c.aclose()


def _wait_echo(url: str, proc: subprocess.Popen[bytes]) -> None:
    while True:
        try:
            httpx.post(f"{url}/v1/chat/completions", content=b"{}", timeout=1)
            return
        except httpx.TransportError:
            if proc.poll() is not None:
                raise RuntimeError("the echo upstream did not start") from None
            time.sleep(0.1)


def _router_process(port: int, upstreams: list[str]) -> subprocess.Popen[bytes]:
    deps = [{"kind": "openai", "name": f"echo{i}", "base_url": f"{u}/v1"} for i, u in enumerate(upstreams)]
    cfg = {"embeddings": False, "cache": {"backend": "off"}, "access_log": False, "models": {"m": {"deployments": deps}}}
    path = Path(tempfile.mkdtemp()) / "router.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "SMOLGATE_CONFIG": str(path), "SMOLGATE_API_KEYS": "", "SMOLGATE_LOG_LEVEL": "warning"}
    return subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port)], env=env)
