"""Greedy agreement with llama.cpp's server on the same GGUF: does the engine continue a prompt as llama-server does?

    python -m bench.peer_agreement --llama-server PATH                 # Gemma 3 270M Q4_K_M (fetched), 40 prompts
    python -m bench.peer_agreement --llama-server PATH --model FILE.gguf --prompts 40 --new-tokens 32

The prompts are windows of held-out text (`backend/quant/data/heldout.txt`, the perplexity benches' text: nothing here
was tuned on it), each its first `--prompt-tokens` tokens after BOS, as token ids, so both servers read exactly the same
ids. Each side continues every prompt greedily for exactly `--new-tokens` tokens (EOS ignored): the engine in process,
once with the file's own bits (`auto`) and once with its float32 copy (`none`), and llama-server through its native
`/completion` (`return_tokens`, no prompt cache). Per pair of sides: the share of prompts whose continuations are
identical, and the mean and median length of the common prefix. Two correct implementations of the same weights
part at near ties (where rounding differs, in activations' quantization or summation order), so `none` against
`auto` is printed beside the peer pairs as the scale of that, and at each prompt where the engine (`auto`) and the peer
part, the engine's own log-probability margin between its token and the peer's (`fork_margins_nats`: a near tie is a
small one). --peer-url URL takes a llama-server already running on
the same file instead (its native `/completion`); without either the peer is absent and only the engine pair is
measured; --peer-gguf is not read (the peer serves --model). Last line: one JSON object, also bench/results/peer_agreement.json.
"""

from __future__ import annotations

import argparse
import gc
import statistics
from pathlib import Path
from typing import Any

import httpx

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import TokenLogprob
from backend.engine.sampling_params import SamplingParams
from bench import peer
from bench.report import default_out, emit

REQUEST_TIMEOUT_S = 300.0


def prompts_of(engine: LLMEngine, count: int, length: int) -> list[list[int]]:
    """`count` windows of the held-out text, `length` tokens each after BOS, spread over the whole text."""
    from backend.quant.calibration import HELDOUT

    ids = engine.tokenizer.encode(HELDOUT.read_text(), add_special_tokens=False)
    bos = engine.tokenizer.bos_token_id
    step = max(length, (len(ids) - length) // count)
    windows = [ids[i : i + length] for i in range(0, len(ids) - length + 1, step)][:count]
    return [([] if bos is None else [bos]) + w for w in windows]


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[TokenLogprob | int]]:
    """Each prompt's new tokens (their TokenLogprob where `params` asks for logprobs)."""
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    got: dict[str, list[TokenLogprob | int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_work:
        for out in engine.step():
            for d in out.deltas:
                got[out.request_id].extend(d.logprobs if d.logprobs is not None else d.token_ids)
    return [got[str(i)] for i in range(len(prompts))]


def margins(engine: LLMEngine, prompts: list[list[int]], ours: list[list[int]], theirs: list[list[int]]) -> list[float]:
    """Where the two continuations first part: the engine's log-probability of its token minus that of the peer's
    (from its top 20; past them, the 20th's), after the shared prefix. Small margins are near ties."""
    cases = [(p, a, b) for p, a, b in zip(prompts, ours, theirs, strict=True) if a != b]
    forks = [common_prefix(a, b) for _, a, b in cases]
    firsts = run(engine, [p + a[:n] for (p, a, _), n in zip(cases, forks, strict=True)],
                 SamplingParams(temperature=0.0, max_tokens=1, logprobs=20))
    out = []
    for (_, a, b), n, [first] in zip(cases, forks, firsts, strict=True):
        assert isinstance(first, TokenLogprob) and first.token_id == a[n], "the engine repeats its own greedy choice"
        top = {t: lp for t, _, lp in first.top}
        out.append(round(first.logprob - top.get(b[n], min(top.values())), 3))
    return out


def engine_side(model: Path, quantization: str, prompts: list[list[int]], new_tokens: int) -> tuple[LLMEngine, list[list[int]]]:
    engine = LLMEngine(EngineConfig(model=str(model), quantization=quantization, enable_prefix_caching=False))
    got = run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    return engine, [[t for t in g if isinstance(t, int)] for g in got]


def peer_continuations(url: str, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    out = []
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        for prompt in prompts:
            body = {"prompt": prompt, "n_predict": new_tokens, "temperature": 0, "top_k": 1, "ignore_eos": True,
                    "return_tokens": True, "cache_prompt": False}
            r = client.post(f"{url}/completion", json=body)
            r.raise_for_status()
            tokens = r.json().get("tokens")
            if not isinstance(tokens, list):
                raise RuntimeError("llama-server sent no `tokens` (a build without `return_tokens`?)")
            out.append([int(t) for t in tokens])
    return out


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def agreement(a: list[list[int]], b: list[list[int]], new_tokens: int) -> dict[str, Any]:
    prefixes = [common_prefix(x, y) for x, y in zip(a, b, strict=True)]
    return {"prompts": len(prefixes), "identical": sum(p == new_tokens for p in prefixes),
            "identical_share": round(sum(p == new_tokens for p in prefixes) / len(prefixes), 3),
            "common_prefix_mean": round(statistics.mean(prefixes), 1), "common_prefix_median": statistics.median(prefixes)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.peer_agreement", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a .gguf file (default: Gemma 3 270M Q4_K_M, fetched)")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="llama-server's threads")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 4 prompts, 8 new tokens")
    ap.add_argument("--out", type=Path, default=None)
    peer.add_peer_args(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens = 4, 8
    if args.model is None:
        from backend.fetch import fetch_gemma_gguf

        args.model = fetch_gemma_gguf()
    probe = LLMEngine(EngineConfig(model=str(args.model), enable_prefix_caching=False))
    prompts = prompts_of(probe, args.prompts, args.prompt_tokens)
    del probe
    gc.collect()
    none_engine, none_tokens = engine_side(args.model, "none", prompts, args.new_tokens)
    del none_engine
    gc.collect()
    auto_engine, auto_tokens = engine_side(args.model, "auto", prompts, args.new_tokens)
    sides = {"auto": auto_tokens, "none": none_tokens}
    result: dict[str, Any] = {"bench": "peer_agreement", "model": args.model.name, "prompts": len(prompts),
                              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                              "auto_vs_none": agreement(sides["auto"], sides["none"], args.new_tokens)}
    if args.peer_url:  # a llama-server already running on the same file (its native /completion)
        theirs = peer_continuations(args.peer_url.rstrip("/"), prompts, args.new_tokens)
        result["peer"] = {"status": "measured", "peer": "llama-server", "url": args.peer_url, "gguf": str(args.model)}
    elif args.llama_server is not None:
        with peer.llama_server(args.llama_server, args.model, args.threads, 1,
                               ctx_per_slot=args.prompt_tokens + args.new_tokens + 64) as url:
            theirs = peer_continuations(url, prompts, args.new_tokens)
        result["peer"] = {"status": "measured", "peer": "llama-server", "binary": str(args.llama_server),
                          "version": peer.peer_version(args.llama_server), "gguf": str(args.model)}
        result["auto_vs_peer"] = agreement(sides["auto"], theirs, args.new_tokens)
        forks = margins(auto_engine, prompts, sides["auto"], theirs)
        result["auto_vs_peer"]["fork_margins_nats"] = sorted(forks)
        if forks:
            result["auto_vs_peer"]["fork_margin_median_nats"] = statistics.median(forks)
        result["none_vs_peer"] = agreement(sides["none"], theirs, args.new_tokens)
    else:
        result["peer"] = peer.absent()
    for key in ("auto_vs_peer", "none_vs_peer", "auto_vs_none"):
        if key in result:
            print(key, result[key], flush=True)
    return emit(result, args.out or default_out("peer_agreement"))


if __name__ == "__main__":
    main()
