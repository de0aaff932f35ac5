"""Determinism against a running server, as a client sees it: greedy and seeded output cold vs prefix-cached and
alone vs inside a batch of 12 other requests, on prompts no test uses (docs/determinism.md).

    make serve                                                    # in another shell (or any smolgate server)
    python -m bench.determinism_live --url http://127.0.0.1:8000

Per prompt, four checks: greedy cold == greedy again (its prefix now cached); greedy alone == greedy sent in the
middle of 12 other requests of different lengths; seeded (temperature 0.8, top_p 0.95) twice alone; seeded alone ==
seeded in that batch. The response cache is bypassed per request (`x-smolgate-cache: no-lookup, no-store`), so
every answer is computed by the engine. The last line printed is one JSON object (also
bench/results/determinism_live.json).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import httpx

from bench.report import default_out, emit

NO_CACHE = {"x-smolgate-cache": "no-lookup, no-store"}
TARGETS = (
    "what should i pack for a two day hiking trip in autumn",
    "Explain in plain words how a bicycle's gears make climbing easier.",
    "give me three tips for keeping basil alive indoors",
)
OTHERS = tuple(f"Write a short note about topic number {i}: " + " ".join(["details"] * (i * 7)) for i in range(12))
GREEDY = {"temperature": 0}
SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 4242}


async def chat(c: httpx.AsyncClient, url: str, model: str, content: str, **kw: Any) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 48, **kw}
    r = await c.post(f"{url}/v1/chat/completions", json=body, headers=NO_CACHE, timeout=600)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


async def in_batch(c: httpx.AsyncClient, url: str, model: str, content: str, **kw: Any) -> str:
    """`content` sent in the middle of 12 other requests (mixed prefill and decode in the engine)."""
    others = [chat(c, url, model, o, temperature=0, max_tokens=24 + 8 * (i % 4)) for i, o in enumerate(OTHERS)]
    results = await asyncio.gather(*others[:6], chat(c, url, model, content, **kw), *others[6:])
    return results[6]


async def check(url: str, model: str, headers: dict[str, str]) -> dict[str, Any]:
    rows = []
    async with httpx.AsyncClient(headers=headers) as c:
        for t in TARGETS:
            cold = await chat(c, url, model, t, **GREEDY)
            cached = await chat(c, url, model, t, **GREEDY)
            batched = await in_batch(c, url, model, t, **GREEDY)
            s1, s2 = await chat(c, url, model, t, **SEEDED), await chat(c, url, model, t, **SEEDED)
            s_batched = await in_batch(c, url, model, t, **SEEDED)
            rows.append({"prompt": t, "greedy_cold_vs_cached": cold == cached, "greedy_alone_vs_batched": cold == batched,
                         "seeded_twice_alone": s1 == s2, "seeded_alone_vs_batched": s1 == s_batched})  # fmt: skip
    identical = sum(v for r in rows for k, v in r.items() if k != "prompt")
    return {"bench": "determinism_live", "url": url, "identical": identical, "checks": 4 * len(rows), "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.determinism_live")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--api-key", default="", help="a key of the server's api_keys, if it has any")
    args = parser.parse_args(argv)
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    result = asyncio.run(check(args.url.rstrip("/"), args.model, headers))
    for row in result["rows"]:
        print(row, flush=True)
    emit(result, default_out("determinism_live"))


if __name__ == "__main__":
    main()
