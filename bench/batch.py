"""Batches behind live traffic: does a running batch hurt live latency, and how fast does a batch run alone?

    python -m bench.batch [--lines 48] [--full] [--new-tokens 32] [--live-requests 3] [--rounds 2]
                          [--latency-only] [--busy-concurrency N] [--url URL --api-key KEY]

Without --url it starts `python -m gateway` (SMALL_SERVER_ENV, the response cache off, batch storage in a
temporary directory). In one run, on one server:
1. engine_32: 32 concurrent live streams (chat, --new-tokens tokens each, ignore_eos): completion tokens/s,
   the engine's 32-stream throughput through the gateway.
2. batch_alone: a batch of --lines lines of the same shape with no live traffic: completion tokens/s from
   in_progress to completed (polled every 0.1 s), and its ratio to engine_32.
3. --rounds times, in turn (so a machine whose load drifts affects both alike):
   live_alone: 4 streaming clients, --live-requests requests each, back to back, no batch;
   live_with_batch: the same while a batch of --lines lines (--full: 500) runs, submitted 1 s before the
   live clients start and cancelled (and waited for) when they are done.
   TTFT p50/p99 and ITL p50/p99 over all rounds, their ratios, and the batch lines finished meanwhile;
   first_ttft_p50_ms: the TTFT p50 of each client's first request of a round (the ones that meet the switch).
The last line printed is one JSON object; it is also written to bench/results/batch.json. On a shared
machine every figure is noisy: compare phases of one run, not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai

from bench.server import SMALL_SERVER_ENV, run_and_report

DEFAULT_OUT = Path(__file__).parent / "results" / "batch.json"
QUESTIONS = ["Tell me about the sea.", "Describe a city at night.", "Write about a long journey.", "Explain the seasons."]


def chat_body(i: int, new_tokens: int) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}],
        "max_tokens": new_tokens,
        "ignore_eos": True,
        "temperature": 0.8,  # never cached: every line runs
    }


def pct(xs: list[float], q: float) -> float | None:
    return round(float(np.percentile(xs, q)) * 1000, 2) if xs else None


async def stream_one(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, list[float]]:
    """TTFT and the inter-token gaps (s) of one streamed chat completion."""
    start = time.perf_counter()
    times: list[float] = []
    async with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                times.append(time.perf_counter())
    return times[0] - start, list(np.diff(times))


async def live(http: httpx.AsyncClient, streams: int, requests: int, new_tokens: int, *, samples: dict[str, list[float]]) -> None:
    """`streams` clients sending `requests` streamed requests each, back to back; adds to samples' ttft and itl."""

    async def client(c: int) -> None:
        for r in range(requests):
            ttft, gaps = await stream_one(http, chat_body(1000 + c * 100 + r, new_tokens))
            samples["ttft"].append(ttft)
            samples["itl"].extend(gaps)
            if r == 0:  # the first request of each client: with a batch running, it meets the switch
                samples["first"].append(ttft)

    await asyncio.gather(*(client(c) for c in range(streams)))


def summary(samples: dict[str, list[float]], wall_s: float) -> dict[str, Any]:
    ttfts, itls = samples["ttft"], samples["itl"]
    return {
        "requests": len(ttfts), "wall_s": round(wall_s, 2), "first_ttft_p50_ms": pct(samples["first"], 50),
        "ttft_p50_ms": pct(ttfts, 50), "ttft_p99_ms": pct(ttfts, 99), "itl_p50_ms": pct(itls, 50), "itl_p99_ms": pct(itls, 99),
    }  # fmt: skip


async def engine_32(http: httpx.AsyncClient, new_tokens: int) -> dict[str, Any]:
    async def one(i: int) -> int:
        resp = await http.post("/v1/chat/completions", json=chat_body(i, new_tokens))
        resp.raise_for_status()
        return int(resp.json()["usage"]["completion_tokens"])

    started = time.perf_counter()
    tokens = sum(await asyncio.gather(*(one(i) for i in range(32))))
    wall = time.perf_counter() - started
    return {"streams": 32, "tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1)}


def submit(client: openai.AsyncOpenAI | openai.OpenAI, lines: int, new_tokens: int, offset: int) -> Any:
    rows = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions", "body": chat_body(offset + i, new_tokens)}
            for i in range(lines)]  # fmt: skip
    data = "\n".join(json.dumps(r) for r in rows).encode()
    f = client.files.create(file=("bench.jsonl", io.BytesIO(data)), purpose="batch")  # type: ignore[union-attr]
    return client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")  # type: ignore[union-attr]


async def batch_alone(client: openai.OpenAI, lines: int, new_tokens: int) -> dict[str, Any]:
    batch = submit(client, lines, new_tokens, 5000)
    started = None
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        await asyncio.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
        if started is None and batch.status in ("in_progress", "finalizing", "completed"):
            started = time.perf_counter()
    wall = time.perf_counter() - (started or time.perf_counter())
    tokens = batch.usage.output_tokens if batch.usage else 0
    return {"lines": lines, "status": batch.status, "tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1) if wall else None}  # fmt: skip


async def work(
    url: str,
    api_key: str,
    lines: int,
    with_batch_lines: int,
    *,
    new_tokens: int,
    live_requests: int,
    rounds: int,
    throughput: bool = True,
) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=api_key or "none", max_retries=0, timeout=600)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as http:
        await stream_one(http, chat_body(0, 4))  # warm-up
        e32 = await engine_32(http, new_tokens) if throughput else {"tokens_per_s": None}
        alone = await batch_alone(client, lines, new_tokens) if throughput else {"tokens_per_s": None}
        quiet: dict[str, list[float]] = {"ttft": [], "itl": [], "first": []}
        busy: dict[str, list[float]] = {"ttft": [], "itl": [], "first": []}
        quiet_s = busy_s = 0.0
        lines_done = 0
        for r in range(rounds):
            started = time.perf_counter()
            await live(http, 4, live_requests, new_tokens, samples=quiet)
            quiet_s += time.perf_counter() - started
            running = submit(client, with_batch_lines, new_tokens, 9000 + r * with_batch_lines)
            while client.batches.retrieve(running.id).status == "validating":
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # the batch is in flight before live traffic starts
            started = time.perf_counter()
            await live(http, 4, live_requests, new_tokens, samples=busy)
            busy_s += time.perf_counter() - started
            lines_done += client.batches.retrieve(running.id).request_counts.completed
            client.batches.cancel(running.id)
            while client.batches.retrieve(running.id).status != "cancelled":  # no batch in the next quiet round
                await asyncio.sleep(0.1)
    ratio = alone["tokens_per_s"] / e32["tokens_per_s"] if alone["tokens_per_s"] and e32["tokens_per_s"] else None
    quiet_summary, busy_summary = summary(quiet, quiet_s), summary(busy, busy_s)
    p50 = busy_summary["ttft_p50_ms"] / quiet_summary["ttft_p50_ms"] if quiet_summary["ttft_p50_ms"] else None
    itl = busy_summary["itl_p50_ms"] / quiet_summary["itl_p50_ms"] if quiet_summary["itl_p50_ms"] else None
    return {
        "bench": "batch", "new_tokens": new_tokens, "rounds": rounds, "engine_32": e32, "batch_alone": alone,
        "batch_vs_engine_32": round(ratio, 3) if ratio else None, "live_alone": quiet_summary,
        "live_with_batch": {**busy_summary, "batch_lines": with_batch_lines, "batch_lines_done": lines_done},
        "ttft_p50_with_over_without": round(p50, 3) if p50 else None, "itl_p50_with_over_without": round(itl, 3) if itl else None,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=48, help="lines of the batch run alone (and of the one under live traffic)")
    parser.add_argument("--full", action="store_true", help="a 500-line batch under live traffic")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--live-requests", type=int, default=3, help="requests per live stream (4 streams)")
    parser.add_argument("--rounds", type=int, default=2, help="live rounds without and with a batch, in turn")
    parser.add_argument("--latency-only", action="store_true", help="skip engine_32 and batch_alone (steps 1-2)")
    parser.add_argument("--busy-concurrency", type=int, help="the started server's batches.busy_concurrency")
    parser.add_argument("--url", help="an already running gateway (default: start one)")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smolgate-bench-batch-") as store:
        env = {**SMALL_SERVER_ENV, "SMOLGATE_CACHE_BACKEND": "off", "SMOLGATE_ACCESS_LOG": "false", "SMOLGATE_BATCHES_DIR": store}
        if args.busy_concurrency is not None:
            env["SMOLGATE_BATCHES_BUSY_CONCURRENCY"] = str(args.busy_concurrency)
        busy_lines = 500 if args.full else args.lines
        run_and_report(
            args.url, env,
            lambda url: work(url, args.api_key, args.lines, busy_lines, new_tokens=args.new_tokens,
                live_requests=args.live_requests, rounds=args.rounds,
                             throughput=not args.latency_only),
            args.out,
        )  # fmt: skip


if __name__ == "__main__":
    main()
