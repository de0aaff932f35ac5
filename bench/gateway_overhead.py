"""How much latency the gateway adds over calling the engine directly, and how many requests/s
it serves, with a trivial engine stand-in (so only the gateway is measured).

    python -m bench.gateway_overhead [--requests 2000] [--concurrency 1 64] [--rounds 3]

Measurements per concurrency level:
  direct   in-process `engine.generate()` calls: the floor with no gateway at all;
  bare     a bare ASGI endpoint returning a canned body through the same uvicorn and client:
           the HTTP transport cost any HTTP server pays;
  gateway  POST /v1/chat/completions through the full gateway app (auth, parsing, chat template,
           SamplingParams, response JSON, metrics, JSON access log to /dev/null), tracing and the spend
           ledger off;
  gateway_ledger  the same with the ledger on (priced, a journal row per request, SQLite in a temporary
           directory): `ledger_added_p50_ms` is what the ledger adds (docs/spend.md);
  traced_unreachable / traced
           the same with OpenTelemetry tracing on (docs/tracing.md): exporting to an OTLP endpoint nobody
           listens on, and to a running OTLP/HTTP sink (its own process, answering every export).
The four gateway variants run side by side and are measured in turns, `--rounds` times each; their
figures are the medians over the rounds (the machine's noise is of the size of the differences).
Servers run in a subprocess; the load generator is a minimal keep-alive HTTP/1.1 client on raw
asyncio streams, so client-side overhead stays small. The last line of output is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from backend.engine.outputs import CompletionDelta, EngineStats, RequestOutput, RequestTimings, Usage
from backend.engine.sampling_params import SamplingParams
from bench.report import default_out, emit

BODY = orjson.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 8,
        "temperature": 0,
    }
)
STREAM_BODY = orjson.dumps({**orjson.loads(BODY), "stream": True})
API_KEY = "sk-bench"


class TrivialEngine:
    """An EngineClient stand-in that answers instantly with a fixed 3-token completion."""

    model_name = "SmolLM2-135M-Instruct"
    max_model_len = 8192

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) % 1000 for c in text]

    def detokenize(self, token_ids: list[int]) -> str:
        return "".join(chr(97 + t % 26) for t in token_ids)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, continue_final_message: bool = False
    ) -> list[int]:
        return [1, 2, 3, *self.tokenize(str(messages[-1]["content"]))]

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        n = len(prompt)
        deltas = tuple(CompletionDelta(i, "Hi there!", (10, 11, 12), None, "stop") for i in range(params.n))
        now = time.monotonic()  # the timings a real engine reports (a traced gateway builds its engine spans from them)
        timings = RequestTimings(now, now, now, now)
        yield RequestOutput(request_id, deltas, Usage(n, 3 * params.n), finished=True, prompt_token_ids=(), timings=timings)

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0, 1000, 0, 0, 0, 0, 0)


# ---- servers (run in a subprocess) ------------------------------------------------------------------


def _fixed_app(body: bytes, content_type: bytes) -> Callable[..., Awaitable[None]]:
    """A bare ASGI app that reads the request and answers `body`, whatever was asked: the HTTP floor any server pays
    (a canned chat.completion), and the OTLP/HTTP sink that answers every export (an empty
    ExportTraceServiceResponse) and keeps nothing."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]

    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


# tracing and ledger off; the ledger on; tracing on, to nobody; tracing on, to a running sink
GATEWAYS = ("gateway", "gateway_ledger", "traced_unreachable", "traced")


def serve(kind: str, port: int, endpoint: str = "", ledger_dir: str = "") -> None:
    from types import MappingProxyType

    import uvicorn

    from gateway.app import build_context, create_app
    from gateway.cache.config import CacheConfig
    from gateway.config import GatewayConfig
    from gateway.spend.config import LedgerConfig, Price, SpendConfig
    from gateway.tracing.config import TracesConfig

    if kind == "bare":
        app: Any = _fixed_app(orjson.dumps({"id": "x", "object": "chat.completion", "choices": []}), b"application/json")
    elif kind == "sink":
        app = _fixed_app(b"", b"application/x-protobuf")
    else:
        sink = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the server process
        traces = TracesConfig(endpoint=endpoint)  # "": tracing off
        ledger = LedgerConfig(enabled=kind == "gateway_ledger", dir=ledger_dir)
        spend = SpendConfig(prices=MappingProxyType({TrivialEngine.model_name: Price(1.0, 2.0)}), ledger=ledger)
        config = GatewayConfig(api_keys=(API_KEY,), cache=CacheConfig(backend="off"), traces=traces,  # the uncached path
                               spend=spend)
        ctx = build_context(config, TrivialEngine(), None, log_sink=sink)
        app = create_app(ctx)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---- load generator ------------------------------------------------------------------------------


def _request_bytes(body: bytes) -> bytes:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        f"authorization: Bearer {API_KEY}\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    headers = head.lower()
    if b"transfer-encoding: chunked" in headers:
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                return status
    start = headers.index(b"content-length:") + 15
    length = int(headers[start : headers.index(b"\r\n", start)])
    await reader.readexactly(length)
    return status


async def _connection(port: int, payload: bytes, count: int, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            writer.write(payload)
            status = await _read_response(reader)
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"HTTP {status}")
    finally:
        writer.close()


async def http_load(port: int, body: bytes, total: int, concurrency: int) -> dict[str, float]:
    payload = _request_bytes(body)
    await asyncio.gather(*(_connection(port, payload, 20, []) for _ in range(concurrency)))  # warm-up
    latencies: list[float] = []
    per_conn = max(1, total // concurrency)
    t0 = time.perf_counter()
    await asyncio.gather(*(_connection(port, payload, per_conn, latencies) for _ in range(concurrency)))
    return _summary(latencies, time.perf_counter() - t0)


async def direct_load(total: int, concurrency: int) -> dict[str, float]:
    engine = TrivialEngine()
    params = SamplingParams(max_tokens=8, temperature=0.0)
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for i in range(count):
            t0 = time.perf_counter()
            prompt = engine.apply_chat_template([{"role": "user", "content": "Hello!"}])
            async for _ in engine.generate(prompt, params, f"r{i}"):
                pass
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(0)

    per = max(1, total // concurrency)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(per) for _ in range(concurrency)))
    return _summary(latencies, time.perf_counter() - t0)


def _summary(latencies: list[float], wall: float) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "rps": len(ordered) / wall,
        "n": len(ordered),
    }


# ---- orchestration -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server_process(kind: str, endpoint: str = "") -> Any:
    port = _free_port()
    ledger_dir = tempfile.mkdtemp(prefix="smolgate-bench-ledger-")  # the server's (uvicorn ends it by its signal)
    proc = subprocess.Popen([sys.executable, "-m", "bench.gateway_overhead", "--serve", kind, "--port", str(port),
                             "--endpoint", endpoint, "--ledger-dir", ledger_dir])
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{kind} server did not start")
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(total: int, levels: list[int], rounds: int = 3) -> dict[str, Any]:
    results: dict[str, Any] = {"direct": {}, "bare": {}, **{g: {} for g in GATEWAYS}, "gateway_stream": {}}
    for c in levels:
        results["direct"][c] = asyncio.run(direct_load(total * 5, c))
    with server_process("bare") as port:
        for c in levels:
            results["bare"][c] = asyncio.run(http_load(port, BODY, total, c))
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(server_process("sink"))
        closed = _free_port()  # nobody listens there: every export fails (and is retried, off the request path)
        endpoints = {"gateway": "", "traced_unreachable": f"http://127.0.0.1:{closed}/v1/traces",
                     "traced": f"http://127.0.0.1:{sink}/v1/traces"}  # fmt: skip
        ports = {g: stack.enter_context(server_process(g if g == "gateway_ledger" else "gateway", endpoints.get(g, "")))
                 for g in GATEWAYS}
        for c in levels:
            runs: dict[str, list[dict[str, float]]] = {g: [] for g in GATEWAYS}
            for _ in range(rounds):
                for g in GATEWAYS:
                    runs[g].append(asyncio.run(http_load(ports[g], BODY, total, c)))
            for g in GATEWAYS:
                results[g][c] = _median_run(runs[g])
            results["gateway_stream"][c] = asyncio.run(http_load(ports["gateway"], STREAM_BODY, total, c))
    return results


def _median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def report(results: dict[str, Any], levels: list[int]) -> dict[str, Any]:
    print(f"{'path':<16}{'clients':>8}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    for kind, by_level in results.items():
        for c in levels:
            r = by_level[c]
            print(f"{kind:<16}{c:>8}{r['p50_ms']:>10.3f}{r['p99_ms']:>10.3f}{r['rps']:>10.0f}")
    figures: dict[str, Any] = {}
    for c in levels:
        d, b, g, s = (results[k][c] for k in ("direct", "bare", "gateway", "gateway_stream"))
        unreachable, traced, gl = (results[k][c] for k in ("traced_unreachable", "traced", "gateway_ledger"))
        figures[f"c{c}"] = {
            "added_p50_ms": round(g["p50_ms"] - d["p50_ms"], 3),
            "added_p99_ms": round(g["p99_ms"] - d["p99_ms"], 3),
            "added_over_bare_http_p50_ms": round(g["p50_ms"] - b["p50_ms"], 3),
            "added_over_bare_http_p99_ms": round(g["p99_ms"] - b["p99_ms"], 3),
            "gateway_rps": round(g["rps"], 1),
            "gateway_stream_rps": round(s["rps"], 1),
            "gateway_stream_p50_ms": round(s["p50_ms"], 3),
            "bare_http_rps": round(b["rps"], 1),
            "direct_p50_ms": round(d["p50_ms"], 4),
            "gateway_p50_ms": round(g["p50_ms"], 3),
            # tracing on (docs/tracing.md), over the same gateway with tracing off
            "tracing_unreachable_added_p50_ms": round(unreachable["p50_ms"] - g["p50_ms"], 3),
            "tracing_added_p50_ms": round(traced["p50_ms"] - g["p50_ms"], 3),
            "tracing_added_p99_ms": round(traced["p99_ms"] - g["p99_ms"], 3),
            "traced_rps": round(traced["rps"], 1),
            # the spend ledger on (docs/spend.md: the bar is +0.5 ms p50), over the same gateway with it off
            "ledger_added_p50_ms": round(gl["p50_ms"] - g["p50_ms"], 3),
            "ledger_added_p99_ms": round(gl["p99_ms"] - g["p99_ms"], 3),
            "gateway_ledger_rps": round(gl["rps"], 1),
        }
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="HTTP requests per measurement")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3, help="turns of the gateway variants (medians reported)")
    parser.add_argument("--out", type=Path, default=None, help="the result file (default bench/results/gateway_overhead.json)")
    parser.add_argument("--serve", choices=["bare", "gateway", "gateway_ledger", "sink"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default="", help=argparse.SUPPRESS)
    parser.add_argument("--ledger-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.endpoint, args.ledger_dir)
        return
    figures = report(run(args.requests, args.concurrency, args.rounds), args.concurrency)
    emit({"bench": "gateway_overhead", "cpus": os.cpu_count(), "requests": args.requests, "rounds": args.rounds, **figures},
         args.out or default_out("gateway_overhead"))


if __name__ == "__main__":
    main()
