"""Overload: offer 2x and 4x the sustainable request rate, then drop back, and watch what the server does.

    python -m bench.overload [--phase-s 20] [--max-tokens 24] [--url URL --api-key KEY]

Without --url it starts `python -m gateway` with a small engine queue (8 running, 8 waiting: what the
server can queue; beyond that the engine answers 429 with Retry-After) and the response cache off.
First a closed loop with 8 clients measures the sustainable rate R (requests/s of this shape: a chat
prompt, --max-tokens tokens, ignore_eos). Then open-loop Poisson arrivals at 2R, 4R, and 0.5R (recovery)
for --phase-s each (recovery: half of min(R, what the 4x phase really got answered), since on a shared machine
the capacity drifts). Per phase: answered (200), turned away (429, each checked for Retry-After), lost
(anything else: 5xx, transport errors; must be 0), latency percentiles of the answered requests, and the
server's RSS (max of /v1/stats samples). The last line printed is one JSON object; it is also written
to bench/results/overload.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.server import SMALL_SERVER_ENV, run_and_report

DEFAULT_OUT = Path(__file__).parent / "results" / "overload.json"
RUNNING, WAITING = 8, 8
SERVER_ENV = {
    **SMALL_SERVER_ENV,
    "SMOLGATE_MAX_NUM_SEQS": str(RUNNING),
    "SMOLGATE_MAX_WAITING": str(WAITING),
    "SMOLGATE_CACHE_BACKEND": "off",
    "SMOLGATE_ACCESS_LOG": "false",
}


@dataclass
class Phase:
    name: str
    offered_rps: float
    latencies: list[float] = field(default_factory=list)  # answered requests only
    rejected: int = 0
    retry_after_missing: int = 0
    lost: list[str] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    sent: int = 0

    def summary(self, elapsed_s: float) -> dict[str, Any]:
        lat = np.array(self.latencies) if self.latencies else np.array([np.nan])
        return {
            "phase": self.name,
            "offered_rps": round(self.offered_rps, 2),
            "sent": self.sent,
            "answered": len(self.latencies),
            "answered_rps": round(len(self.latencies) / elapsed_s, 2),
            "rejected_429": self.rejected,
            "retry_after_missing": self.retry_after_missing,
            "lost": len(self.lost),
            "lost_examples": self.lost[:5],
            "latency_p50_s": _r(np.percentile(lat, 50)),
            "latency_p99_s": _r(np.percentile(lat, 99)),
            "latency_max_s": _r(lat.max()),
            "rss_max_mb": round(max(self.rss) / 2**20, 1) if self.rss else None,
        }


def _r(x: float) -> float | None:
    return None if np.isnan(x) else round(float(x), 3)


def _body(i: int, max_tokens: int) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"Request {i}: write a few words about the sea."}]
    return {"model": "gpt-4o-mini", "messages": messages, "max_tokens": max_tokens, "ignore_eos": True}


async def one(http: httpx.AsyncClient, phase: Phase, i: int, max_tokens: int) -> None:
    phase.sent += 1
    began = time.monotonic()
    try:
        resp = await http.post("/v1/chat/completions", json=_body(i, max_tokens))
    except httpx.HTTPError as exc:
        phase.lost.append(repr(exc)[:120])
        return
    if resp.status_code == 200:
        phase.latencies.append(time.monotonic() - began)
    elif resp.status_code == 429:
        phase.rejected += 1
        phase.retry_after_missing += "retry-after" not in resp.headers
    else:
        phase.lost.append(f"{resp.status_code} {resp.text[:120]}")


async def closed_loop(http: httpx.AsyncClient, clients: int, duration_s: float, max_tokens: int) -> tuple[Phase, float]:
    phase = Phase("capacity", 0.0)
    deadline = time.monotonic() + duration_s
    counter = iter(range(10**9))

    async def client() -> None:
        while time.monotonic() < deadline:
            await one(http, phase, next(counter), max_tokens)

    began = time.monotonic()
    await asyncio.gather(*(client() for _ in range(clients)))
    return phase, time.monotonic() - began


async def open_loop(http: httpx.AsyncClient, phase: Phase, duration_s: float, max_tokens: int, *, rng: random.Random) -> float:
    """Poisson arrivals at phase.offered_rps; waits for every request sent in the phase."""
    tasks: list[asyncio.Task[None]] = []
    began = time.monotonic()
    next_at = began
    while next_at < began + duration_s:
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        tasks.append(asyncio.create_task(one(http, phase, rng.randrange(10**9), max_tokens)))
        next_at += rng.expovariate(phase.offered_rps)
    await asyncio.gather(*tasks)
    return time.monotonic() - began


async def sample_rss(http: httpx.AsyncClient, phase_of: list[Phase], stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            resp = await http.get("/v1/stats")
            phase_of[-1].rss.append(resp.json()["process"]["rss_bytes"] or 0)
        except httpx.HTTPError:
            pass
        await asyncio.sleep(1.0)


async def overload(url: str, api_key: str | None, phase_s: float, max_tokens: int, *, seed: int = 0) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as http:
        await one(http, Phase("warmup", 0), 0, max_tokens)
        current: list[Phase] = [Phase("capacity", 0.0)]
        stop = asyncio.Event()
        sampler = asyncio.create_task(sample_rss(http, current, stop))
        capacity, elapsed = await closed_loop(http, RUNNING, phase_s, max_tokens)
        capacity.rss = current[0].rss
        rate = len(capacity.latencies) / elapsed
        results = [capacity.summary(elapsed)]
        rng = random.Random(seed)
        for name, factor in (("2x", 2.0), ("4x", 4.0), ("recovery", 0.5)):
            # The machine is shared: what it serves drifts. Recovery offers half of what was really being
            # served under overload (when lower than R), so "the load dropped" holds at that moment too.
            base = rate if name != "recovery" else min(rate, results[-1]["answered_rps"])
            phase = Phase(name, base * factor)
            current.append(phase)
            results.append(phase.summary(await open_loop(http, phase, phase_s, max_tokens, rng=rng)))
        stop.set()
        await sampler
    return {
        "sustainable_rps": round(rate, 3),
        "engine_slots": {"running": RUNNING, "waiting": WAITING},
        "max_tokens": max_tokens,
        "phase_s": phase_s,
        "phases": results,
        "lost_total": sum(p["lost"] for p in results),
        "retry_after_missing_total": sum(p["retry_after_missing"] for p in results),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--url", help="load this gateway instead of starting one (its queue limits apply)")
    parser.add_argument("--api-key", help="Bearer key for --url")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    run_and_report(args.url, SERVER_ENV, lambda url: overload(url, args.api_key, args.phase_s, args.max_tokens), args.out)


if __name__ == "__main__":
    main()
