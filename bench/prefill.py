"""Time to first token on long prompts, through the server as users reach it, next to llama.cpp's server.

    python -m bench.prefill                                      # 128, 512 and 2,000-token prompts, 3 rounds
    python -m bench.prefill --llama-server PATH                  # llama-server measured in the same run
    python -m bench.prefill --lengths 2000 --reps 5 --peer-url http://127.0.0.1:8080
    python -m bench.prefill --url http://127.0.0.1:8000 --api-key KEY   # a running gateway instead of a fresh one

Ours: `python -m gateway` started in its serving configuration (SMOLGATE_* variables apply; by default the AWQ
INT4 copy of the default model, prefix and response caches on as shipped), unless --url names a running one.
The peer (bench/peer.py): llama-server with one slot and the shipped Q4_1 GGUF, or any OpenAI-compatible server.

Every prompt is a fresh list of random token ids (both servers use the model's vocabulary) with a first token no
other prompt of the run has, so neither server's prefix or prompt cache can help; each prompt goes to both sides.
A request is `POST /v1/completions` with those ids, streamed, greedy, `ignore_eos`, --new-tokens new tokens, one
request in flight at a time; TTFT is from sending it to the first chunk with text (the same client code for both
sides). Rounds interleave the sides (who goes first alternates) so both see the same phase of a shared machine.
Reported per length: TTFT p50 and min of each side, prefill tokens/s (prompt tokens / TTFT p50), the ratio ours /
peer of the p50s (below 1: ours is faster) and the median of each round's ratio (`paired`: the two requests of a
round ran back to back, so it holds better on a shared machine), and the prompt and cached token counts each server
reported. Without a peer flag the peer is reported as absent. Last line: one JSON object (also
bench/results/prefill.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from backend.config import EngineConfig, engine_config_from_env
from bench import peer
from bench.report import emit
from bench.server import GatewayProcess

DEFAULT_OUT = Path(__file__).parent / "results" / "prefill.json"
TOKEN_RANGE = (1000, 30000)  # ordinary vocabulary entries: no special or control tokens
SETTLE_S = 0.5  # between requests: lets the side that just answered go idle (llama.cpp's threads poll a while)
START_TIMEOUT_S = 600.0  # a fresh gateway on a busy 2-core machine


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.prefill", description=__doc__.split("\n")[0])
    p.add_argument("--lengths", default="128,512,2000", help="prompt lengths in tokens")
    p.add_argument("--reps", type=int, default=3, help="rounds: one prompt per length per round")
    p.add_argument("--new-tokens", type=int, default=2, help="tokens generated per request (default 2)")
    p.add_argument("--quantization", choices=["auto", "awq", "none"],
                   help="our server's copy of the default model (default: SMOLGATE_QUANTIZATION, else auto)")
    p.add_argument("--url", default="", help="a running gateway to measure instead of starting one")
    p.add_argument("--api-key", default="", help="bearer key for --url")
    p.add_argument("--threads", type=int, default=0, help="llama-server's -t (0: the cores this process may use)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    peer.add_peer_args(p)
    args = p.parse_args(argv)
    args.lengths = [int(n) for n in args.lengths.split(",") if n.strip()]
    if not args.lengths or min(args.lengths) < 1 or args.reps < 1 or args.new_tokens < 1:
        p.error("--lengths, --reps and --new-tokens must be positive")
    return args


def unique_prompts(lengths: list[int], reps: int, seed: int | None = None) -> list[list[int]]:
    """One prompt per (round, length) plus a warm-up per length, each starting with a token no other one starts
    with: no prefix of one is a prefix of another, so no cache serves any part of it. Unseeded, a new set each run:
    a running server measured twice (--url, --peer-url) has not seen them either."""
    rng = random.Random(seed)
    firsts = rng.sample(range(*TOKEN_RANGE), (reps + 1) * len(lengths))
    return [[first, *(rng.randrange(*TOKEN_RANGE) for _ in range(n - 1))]
            for first, n in zip(firsts, lengths * (reps + 1), strict=True)]


def serving_config(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration a fresh `python -m gateway` gets (SMOLGATE_* variables apply), with --quantization."""
    config = engine_config_from_env(EngineConfig())
    return replace(config, quantization=args.quantization or config.quantization)


@contextlib.contextmanager
def our_server(args: argparse.Namespace) -> Iterator[str]:
    """--url as given, or a fresh `python -m gateway` in its serving configuration (no API keys: local)."""
    if args.url:
        yield args.url.rstrip("/")
        return
    config = serving_config(args)
    if not config.resolved_model().exists():
        raise SystemExit(f"{config.resolved_model()} is missing: run `python -m backend.fetch` "
                         "(it builds the serving copy) or pass --quantization none")
    env = {"SMOLGATE_API_KEYS": ""}
    if args.quantization:
        env["SMOLGATE_QUANTIZATION"] = args.quantization
    server = GatewayProcess.start(env, timeout_s=START_TIMEOUT_S)
    try:
        yield server.url
    finally:
        server.kill()


class Side:
    """One server under test: its URL, model id, and every timing it gave, by prompt length."""

    def __init__(self, name: str, url: str, api_key: str) -> None:
        self.name, self.url = name, url
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = ""
        self.timings: dict[int, list[peer.PeerTiming]] = {}

    async def time(self, client: httpx.AsyncClient, prompt: list[int], new_tokens: int) -> peer.PeerTiming:
        if not self.model:  # the server's own (first) model id: llama-server serves one
            self.model = (await client.get(f"{self.url}/v1/models")).raise_for_status().json()["data"][0]["id"]
        return await peer.time_completion(client, self.url, self.model, prompt, new_tokens=new_tokens)

    def summary(self, n: int) -> dict[str, Any]:
        ttfts = [t.ttft_s * 1e3 for t in self.timings[n]]
        p50 = statistics.median(ttfts)
        prompt_tokens = {t.prompt_tokens for t in self.timings[n]}
        return {
            "ttft_ms": [round(x, 1) for x in ttfts],
            "ttft_p50_ms": round(p50, 1),
            "ttft_min_ms": round(min(ttfts), 1),
            "prefill_tok_s": round(n / p50 * 1e3, 1),
            "prompt_tokens": prompt_tokens.pop() if len(prompt_tokens) == 1 else sorted(prompt_tokens, key=str),
            "cached_tokens": sum(t.cached_tokens or 0 for t in self.timings[n]),
        }


async def measure(sides: list[Side], lengths: list[int], reps: int, new_tokens: int) -> None:
    """A warm-up request per length on each side, then `reps` rounds; in each, every length's prompt goes to
    every side, the side that goes first alternating by round."""
    prompts = iter(unique_prompts(lengths, reps))
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(httpx.AsyncClient(headers=side.headers)) for side in sides]
        pairs = list(zip(sides, clients, strict=True))
        for _ in lengths:  # warm-up: first-use costs (buffers sized for the longest chunk, lazy init) not timed
            prompt = next(prompts)
            for side, client in pairs:
                await side.time(client, prompt, new_tokens)
        for rep in range(reps):
            for n in lengths:
                prompt = next(prompts)
                for side, client in pairs if rep % 2 == 0 else pairs[::-1]:
                    await asyncio.sleep(SETTLE_S)
                    side.timings.setdefault(n, []).append(await side.time(client, prompt, new_tokens))


def report(sides: list[Side], lengths: list[int]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for n in lengths:
        row = {side.name: side.summary(n) for side in sides}
        if len(sides) == 2:
            ours, other = (row[side.name]["ttft_ms"] for side in sides)
            row["ratio_ours_over_peer"] = round(row["ours"]["ttft_p50_ms"] / row["peer"]["ttft_p50_ms"], 3)
            # each round's two requests ran back to back: their ratio sees one phase of a shared machine's load
            row["ratio_paired_p50"] = round(statistics.median(a / b for a, b in zip(ours, other, strict=True)), 3)
        rows[str(n)] = row
    return rows


def format_table(rows: dict[str, Any], peer_name: str | None) -> str:
    lines = [f"{'prompt':>7}  {'ours p50':>9} {'min':>8} {'tok/s':>8}"
             + (f"  {'peer p50':>9} {'min':>8} {'tok/s':>8}  {'ours/peer':>9} {'paired':>7}" if peer_name else "")
             + "   (TTFT in ms)"]
    for n, row in rows.items():
        ours = row["ours"]
        line = f"{n:>7}  {ours['ttft_p50_ms']:9.1f} {ours['ttft_min_ms']:8.1f} {ours['prefill_tok_s']:8.1f}"
        if "peer" in row:
            p = row["peer"]
            line += f"  {p['ttft_p50_ms']:9.1f} {p['ttft_min_ms']:8.1f} {p['prefill_tok_s']:8.1f}"
            line += f"  {row['ratio_ours_over_peer']:9.3f} {row['ratio_paired_p50']:7.3f}"
        lines.append(line)
    lines.append(f"peer: {peer_name}" if peer_name else "peer: absent (pass --llama-server PATH or --peer-url URL)")
    for n, row in rows.items():  # a server that says it reused cached prompt tokens was not timed on a cold prompt
        lines += [f"note: {side} reported {row[side]['cached_tokens']} cached prompt tokens at {n}: a cache helped"
                  for side in ("ours", "peer") if side in row and row[side]["cached_tokens"]]
    return "\n".join(lines)


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    load_at_start = os.getloadavg()[0]  # a shared machine explains noisy figures
    threads = args.threads or usable_cores()
    ctx = max(args.lengths) + args.new_tokens + 16
    with our_server(args) as url, (
        peer.peer_url_or_server(args, threads, 1, ctx) if peer.wanted(args) else contextlib.nullcontext()
    ) as peer_url:
        sides = [Side("ours", url, args.api_key)]
        if peer_url:
            sides.append(Side("peer", peer_url, args.peer_api_key))
        start = time.perf_counter()
        asyncio.run(measure(sides, args.lengths, args.reps, args.new_tokens))
        seconds = time.perf_counter() - start
    rows = report(sides, args.lengths)
    described = peer.describe(args) if peer.wanted(args) else peer.absent()
    print(format_table(rows, described.get("peer") if peer.wanted(args) else None))
    result = {
        "bench": "prefill",
        "ours": {"server": args.url} if args.url else
                {"server": "python -m gateway", "quantization": serving_config(args).quantization},
        "peer": {**described, **({"threads": threads} if args.llama_server and not args.peer_url else {})},
        "reps": args.reps,
        "new_tokens": args.new_tokens,
        "load_avg_1m_at_start": round(load_at_start, 2),
        "measure_s": round(seconds, 1),
        "lengths": rows,
    }
    return emit(result, args.out)


if __name__ == "__main__":
    main()
