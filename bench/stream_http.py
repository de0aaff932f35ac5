"""One chat stream over HTTP, end to end: tokens/s, inter-token latency and where the server's CPU goes per token.

    python -m bench.stream_http [--streams 1,8] [--requests 4] [--new-tokens 128] [--url http://host:port]

Starts `python -m gateway` (the default serving configuration: SMOLGATE_* variables apply; no embedder, response
cache off so repeated prompts reach the engine) unless --url names a running one. Per concurrency level it sends
`max(streams, --requests)` streamed chat completions (the throughput bench's questions, greedy, ignore_eos, exactly
--new-tokens tokens) with at most `streams` in flight, from a small keep-alive HTTP/1.1 client on raw asyncio
streams (so the client itself costs little of the 2 cores it shares with the server). Per request: time to first
token and the gaps between successive content events (divided evenly when an event carries several tokens).

The server's CPU per generated token, by thread, is read from /proc/PID/task/*/schedstat (time on a CPU, in ns),
which counts work, not waiting, so it stays meaningful on a loaded machine where wall-clock figures do not:
`event_loop` (the main thread: HTTP, JSON, SSE, asyncio), `engine_loop` (the engine thread: scheduling, the
Python around the forward, sampling, detokenizing, and its own share of the kernels' OpenMP work) and `workers`
(the other threads: OpenMP workers). Linux only for that part. Last line: one JSON object (bench/results/stream_http.json).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.report import emit
from bench.server import SMALL_SERVER_ENV, GatewayProcess
from bench.throughput import questions_for

DEFAULT_OUT = Path(__file__).parent / "results" / "stream_http.json"
SERVER_ENV = {**SMALL_SERVER_ENV, "SMOLGATE_CACHE_BACKEND": "off"}


@dataclass
class StreamTiming:
    ttft_s: float
    itls_s: list[float] = field(default_factory=list)
    tokens: int = 0


def request_bytes(host: str, model: str, question: str, new_tokens: int) -> bytes:
    body = orjson.dumps({
        "model": model, "messages": [{"role": "user", "content": question}], "stream": True,
        "stream_options": {"include_usage": True}, "max_tokens": new_tokens, "temperature": 0, "ignore_eos": True,
    })
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def read_events(reader: asyncio.StreamReader) -> Any:
    """Yield (arrival time, SSE data payload) of one chunked streamed response."""
    head = await reader.readuntil(b"\r\n\r\n")
    if int(head[9:12]) != 200:
        raise RuntimeError(f"HTTP {head[9:12].decode()}: {head!r}")
    buf = b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        data = await reader.readexactly(size + 2)
        if size == 0:
            return
        now = time.perf_counter()
        buf += data[:-2]
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: "):
                    yield now, line[6:]


async def one_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> StreamTiming:
    start = time.perf_counter()
    writer.write(payload)
    arrivals: list[float] = []
    tokens = 0
    async for now, data in read_events(reader):
        if data == b"[DONE]":
            continue  # read on to the chunked body's end, so the connection is ready for the next request
        obj = orjson.loads(data)
        if obj.get("usage"):
            tokens = obj["usage"]["completion_tokens"]
        if any(c["delta"].get("content") for c in obj["choices"]):
            arrivals.append(now)
    if not arrivals:
        raise RuntimeError("no content")
    timing = StreamTiming(arrivals[0] - start, tokens=tokens)
    per_event = max(1.0, (tokens - 1) / max(len(arrivals) - 1, 1))  # several tokens in one event: split its gap
    timing.itls_s = [(b - a) / per_event for a, b in itertools.pairwise(arrivals)]
    return timing


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """CPU time so far of the server's threads, grouped: event_loop (main thread), engine_loop, workers."""
    groups = {"event_loop": 0, "engine_loop": 0, "workers": 0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            ns = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
        group = "event_loop" if int(tid) == pid else "engine_loop" if name.startswith("engine-loop") else "workers"
        groups[group] += ns
    return groups


async def run_level(url: str, pid: int | None, streams: int, requests: int, *, new_tokens: int) -> dict[str, Any]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    questions = questions_for(requests)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for q in questions:
        queue.put_nowait(q)
    timings: list[StreamTiming] = []

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not queue.empty():
                timings.append(await one_stream(reader, writer, request_bytes(host, model, queue.get_nowait(), new_tokens)))
        finally:
            writer.close()

    # warm-up: one short request per connection (first-call costs, connection set-up)
    await asyncio.gather(*(_warm(host, int(port), model) for _ in range(min(streams, 2))))
    cpu0 = thread_cpu_ns(pid) if pid else None
    start = time.perf_counter()
    await asyncio.gather(*(connection() for _ in range(streams)))
    wall = time.perf_counter() - start
    tokens = sum(t.tokens for t in timings)
    if tokens != requests * new_tokens:
        raise RuntimeError(f"expected {requests * new_tokens} tokens, got {tokens}")
    itls = [x for t in timings for x in t.itls_s]
    result: dict[str, Any] = {
        "streams": streams, "requests": requests, "tokens": tokens, "wall_s": round(wall, 3),
        "tok_s": round(tokens / wall, 2), "ttft_p50_ms": _ms([t.ttft_s for t in timings], 50),
        "itl_p50_ms": _ms(itls, 50), "itl_p99_ms": _ms(itls, 99), "itl_max_ms": _ms(itls, 100),
    }
    if cpu0 is not None and pid is not None:
        cpu1 = thread_cpu_ns(pid)
        result["server_cpu_ms_per_token"] = {k: round((cpu1[k] - cpu0[k]) / 1e6 / tokens, 3) for k in cpu0}
    return result


async def _warm(host: str, port: int, model: str) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        await one_stream(reader, writer, request_bytes(host, model, "Say hello.", 4))
    finally:
        writer.close()


def _ms(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 2) if values else None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.stream_http", description=__doc__.split("\n")[0])
    p.add_argument("--streams", default="1", help="comma-separated concurrency levels (default 1)")
    p.add_argument("--requests", type=int, default=4, help="requests per level: max(streams, this) (default 4)")
    p.add_argument("--new-tokens", type=int, default=128, help="new tokens per request (default 128)")
    p.add_argument("--url", default="", help="a running gateway (default: start one)")
    p.add_argument("--pid", type=int, default=0, help="with --url: the gateway's process id, for its CPU per thread")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON result")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    levels = [int(s) for s in args.streams.split(",") if s]
    server = None if args.url else GatewayProcess.start(SERVER_ENV)
    url = args.url or server.url  # type: ignore[union-attr]
    pid = server.proc.pid if server is not None else args.pid or None
    pid = pid if pid and Path(f"/proc/{pid}/task").is_dir() else None
    try:
        results = [asyncio.run(run_level(url, pid, s, max(s, args.requests), new_tokens=args.new_tokens)) for s in levels]
    finally:
        if server is not None:
            server.kill()
    for r in results:
        print(f"{r['streams']:>3} streams: {r['tok_s']:8.1f} tok/s  ITL p50 {r['itl_p50_ms']} ms  p99 {r['itl_p99_ms']} ms  "
              f"max {r['itl_max_ms']} ms  server CPU ms/token {r.get('server_cpu_ms_per_token')}")
    return emit({"bench": "stream_http", "new_tokens": args.new_tokens, "levels": results,
                 "server": "given" if args.url else "python -m gateway", "server_env": {} if args.url else SERVER_ENV,
                 "load_avg": os.getloadavg()}, args.out)


if __name__ == "__main__":
    main()
