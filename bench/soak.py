"""Soak: mixed traffic against a real gateway for N minutes, then checks that nothing leaked.

    python -m bench.soak --minutes 30 [--concurrency 4] [--url http://127.0.0.1:8000 --api-key KEY]

Without --url it starts `python -m gateway` (bench/server.py: no embedder, 128 MB of KV blocks) and
soaks that. Every worker loops over a weighted mix: plain and streamed chat, completions, repeated
temperature-0 questions (response-cache hits), clients that hang up mid-stream or before the answer,
and bad requests (invalid JSON, unknown model, missing fields, out-of-range values). Each outcome is
checked against what that kind must get; anything else (a 5xx, a transport error, a stream without
[DONE], a wrong status) is an unexpected error. At the end, once idle: KV blocks still held (a leak),
the server's RSS over the run (/v1/stats samples every 2 s) and how much it grew after warm-up.
The last line printed is one JSON object; it is also written to bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.server import SMALL_SERVER_ENV, run_and_report

DEFAULT_OUT = Path(__file__).parent / "results" / "soak.json"
CACHED_QUESTIONS = ["Name a colour.", "Name a fruit.", "Say hello.", "Count to three.", "Name a planet."]
MODEL = "gpt-4o-mini"


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)  # "kind:ok" / "kind:unexpected"
    unexpected: list[str] = field(default_factory=list)
    cache_hits: int = 0

    def ok(self, kind: str) -> None:
        self.outcomes[f"{kind}:ok"] += 1

    def bad(self, kind: str, what: str) -> None:
        self.outcomes[f"{kind}:unexpected"] += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(f"{kind}: {what}")


def _chat(content: str, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 12, **kw}


async def plain(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    resp = await http.post("/v1/chat/completions", json=_chat(f"Tell me about the number {rng.randint(0, 10**6)}."))
    if resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] is not None:
        tally.ok("plain")
    else:
        tally.bad("plain", f"{resp.status_code} {resp.text[:120]}")


async def stream(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    body = _chat(f"Describe the colour number {rng.randint(0, 10**6)}.", stream=True)
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        lines = [line async for line in resp.aiter_lines() if line]
    if resp.status_code == 200 and lines[-1:] == ["data: [DONE]"] and not any(x.startswith("event: error") for x in lines):
        tally.ok("stream")
    else:
        tally.bad("stream", f"{resp.status_code} last={lines[-1:]}")


async def completion(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    body = {"model": MODEL, "prompt": f"Once upon a time, {rng.randint(0, 10**6)} ", "max_tokens": 12}
    resp = await http.post("/v1/completions", json=body)
    if resp.status_code == 200 and resp.json()["choices"][0]["text"] is not None:
        tally.ok("completion")
    else:
        tally.bad("completion", f"{resp.status_code} {resp.text[:120]}")


async def cached(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    resp = await http.post("/v1/chat/completions", json=_chat(rng.choice(CACHED_QUESTIONS), temperature=0))
    if resp.status_code == 200:
        tally.ok("cached")
        tally.cache_hits += resp.headers.get("x-cache") == "hit"
    else:
        tally.bad("cached", f"{resp.status_code} {resp.text[:120]}")


async def abort_stream(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    """Hang up after the first chunk of a long answer (the server must abort the engine request)."""
    body = _chat("Tell me a long story.", stream=True, max_tokens=200, ignore_eos=True)
    async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                break
    (tally.ok if resp.status_code == 200 else lambda k: tally.bad(k, str(resp.status_code)))("abort_stream")


async def abort_plain(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    """Give up on a long non-streamed answer before it is ready."""
    body = _chat("Tell me a long story.", max_tokens=200, ignore_eos=True)
    try:
        resp = await http.post("/v1/chat/completions", json=body, timeout=0.3 + rng.random())
    except httpx.TimeoutException:
        tally.ok("abort_plain")
        return
    (tally.ok if resp.status_code == 200 else lambda k: tally.bad(k, str(resp.status_code)))("abort_plain")


_BAD_REQUESTS: list[tuple[str, bytes | dict[str, Any], int]] = [
    ("/v1/chat/completions", b'{"model": "gpt-4o-mini", "messages": [', 400),
    ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "Hi"}]}, 404),
    ("/v1/chat/completions", {"model": MODEL}, 400),
    ("/v1/chat/completions", _chat("Hi", max_tokens=-1), 400),
    ("/v1/chat/completions", _chat("Hi", temperature="hot"), 400),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "n": 0}, 400),
    ("/v1/no-such-route", {}, 404),
]


async def bad(http: httpx.AsyncClient, tally: Tally, rng: random.Random) -> None:
    path, body, want = rng.choice(_BAD_REQUESTS)
    if isinstance(body, bytes):
        resp = await http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        resp = await http.post(path, json=body)
    if resp.status_code == want and "error" in resp.json():
        tally.ok("bad")
    else:
        tally.bad("bad", f"{path} wanted {want}, got {resp.status_code} {resp.text[:120]}")


Action = Callable[[httpx.AsyncClient, Tally, random.Random], Awaitable[None]]
MIX: list[tuple[Action, int]] = [
    (plain, 4), (stream, 4), (completion, 2), (cached, 4), (abort_stream, 1), (abort_plain, 1), (bad, 2),
]  # fmt: skip


async def worker(http: httpx.AsyncClient, tally: Tally, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    actions, weights = zip(*MIX, strict=True)
    while time.monotonic() < deadline:
        action = rng.choices(actions, weights)[0]
        try:
            await action(http, tally, rng)
        except Exception as exc:  # a transport error or a malformed answer: never expected
            tally.bad(action.__name__, repr(exc)[:160])


async def _stats(http: httpx.AsyncClient) -> dict[str, Any]:
    resp = await http.get("/v1/stats")
    resp.raise_for_status()
    return resp.json()


async def sample_rss(http: httpx.AsyncClient, deadline: float, out: list[tuple[float, int]]) -> None:
    start = time.monotonic()
    while time.monotonic() < deadline:
        rss = (await _stats(http))["process"]["rss_bytes"]
        if rss:
            out.append((time.monotonic() - start, rss))
        await asyncio.sleep(2.0)


async def wait_idle(http: httpx.AsyncClient, timeout_s: float = 60.0) -> dict[str, Any]:
    """Stats once nothing is in flight and the engine holds no request (or at the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await _stats(http)
        engine = stats["engine"] or {}
        idle = stats["requests"]["in_flight"] == 0 and engine.get("running") == 0 and engine.get("waiting") == 0
        if (idle and engine.get("kv_blocks_used") == 0) or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.2)


def rss_summary(samples: list[tuple[float, int]]) -> dict[str, float | None]:
    """Growth after warm-up: the median of the last fifth minus the median of the second fifth."""
    if len(samples) < 5:
        return {"start_mb": None, "end_mb": None, "max_mb": None, "growth_mb": None}
    mb = [r / 2**20 for _, r in samples]
    fifth = len(mb) // 5
    start, end = statistics.median(mb[fifth : 2 * fifth]), statistics.median(mb[-fifth:])
    return {"start_mb": round(start, 1), "end_mb": round(end, 1), "max_mb": round(max(mb), 1), "growth_mb": round(end - start, 1)}


async def soak(url: str, api_key: str | None, duration_s: float, concurrency: int, *, seed: int = 0) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as http:
        before = await _stats(http)
        deadline = time.monotonic() + duration_s
        tally, rss = Tally(), []  # type: ignore[var-annotated]
        began = time.monotonic()
        workers = [worker(http, tally, deadline, seed + i) for i in range(concurrency)]
        await asyncio.gather(sample_rss(http, deadline, rss), *workers)
        elapsed = time.monotonic() - began
        after = await wait_idle(http)
    by_kind: dict[str, dict[str, int]] = {}
    for key, n in sorted(tally.outcomes.items()):
        kind, outcome = key.split(":")
        by_kind.setdefault(kind, {"ok": 0, "unexpected": 0})[outcome] = n
    served = after["requests"]["total"] - before["requests"]["total"]
    server_errors = after["requests"]["by_status"].get("5xx", 0) - before["requests"]["by_status"].get("5xx", 0)
    return {
        "duration_s": round(elapsed, 1),
        "concurrency": concurrency,
        "requests": sum(tally.outcomes.values()),
        "requests_per_s": round(sum(tally.outcomes.values()) / elapsed, 2),
        "served_by_gateway": served,
        "by_kind": by_kind,
        "unexpected_errors": sum(v["unexpected"] for v in by_kind.values()),
        "unexpected_examples": tally.unexpected,
        "server_5xx": server_errors,
        "cache_hits": tally.cache_hits,
        "leaked_kv_blocks": (after["engine"] or {}).get("kv_blocks_used"),
        "in_flight_after": after["requests"]["in_flight"],
        "rss": rss_summary(rss),
        "rss_samples_mb": [[round(t, 1), round(r / 2**20, 1)] for t, r in rss],  # bench/plots.py draws them
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--url", help="soak this gateway instead of starting one")
    parser.add_argument("--api-key", help="Bearer key for --url")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    run_and_report(args.url, SMALL_SERVER_ENV, lambda url: soak(url, args.api_key, args.minutes * 60, args.concurrency), args.out)


if __name__ == "__main__":
    main()
