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
small one).

Whole continuations part at the first near tie and never meet again, so two more figures say how close the two are:
- `teacher_forced`: the engine reads each prompt with the peer's continuation appended (prompt log-probabilities),
  and at each of the peer's tokens its own greedy choice is compared with the peer's: the share of the peer's tokens
  the engine would have chosen given the same text.
- `float_vs_peer_float`: the same weights in float32 on both sides: the engine's `none` against llama-server serving a
  float32 copy of the file (every tensor dequantized by gguf-py, the header as it is): whether the two compute the
  same model, apart from the quantized arithmetic.
- `peer_vs_peer_float`: llama-server on the file against llama-server on that float32 copy: how far the peer's own
  quantized arithmetic moves its continuations, the scale against which `auto_vs_peer` is read.
- `peer_vs_peer_fa_off`: llama-server on the file against itself with flash attention off (`-fa off`): the same
  weights and the same quantized matmuls, only the attention's rounding changed.
- `auto_vs_auto_one_ulp` and `none_vs_none_one_ulp`: each engine side against itself with the smallest change to the
  model there is, the first layer's input-norm weights raised by one float32 ulp (about 1e-7 of each): how far a
  rounding difference carries on each path. Where activations are quantized to int8 before every matmul, a change
  that small tips some roundings, and the next layers' quantization carries that on: a measure of how close any two
  implementations that are not bit-identical can come.

--peer-url URL takes a llama-server already running on the same file instead (its native `/completion`; then no
float32 runs); without either the peer is absent and only the engine pair is measured; --peer-gguf is not read
(the peer serves --model). Last line: one JSON object, also bench/results/peer_agreement.json.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import TokenLogprob
from backend.engine.sampling_params import SamplingParams
from backend.model.llama import LlamaForCausalLM
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


def teacher_forced(engine: LLMEngine, prompts: list[list[int]], theirs: list[list[int]]) -> dict[str, Any]:
    """At every token of the peer's continuations, whether the engine's greedy choice on the same text (the prompt and
    the peer's tokens before it) is the peer's token; where not, the engine's margin between its choice and the
    peer's token (nats, from the peer token's own log-probability)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=20)
    for i, (prompt, tokens) in enumerate(zip(prompts, theirs, strict=True)):
        engine.add_request(f"tf{i}", prompt + tokens, replace(params, prompt_logprobs_from=len(prompt)))
    read: dict[str, tuple[TokenLogprob | None, ...]] = {}
    while engine.has_work:
        read.update((o.request_id, o.prompt_logprobs) for o in engine.step() if o.prompt_logprobs is not None)
    chosen, margins_ = 0, []
    for i, (prompt, tokens) in enumerate(zip(prompts, theirs, strict=True)):
        scored = read[f"tf{i}"][len(prompt) :]
        assert len(scored) == len(tokens), "one log-probability per peer token"
        for lp, token in zip(scored, tokens, strict=True):
            assert lp is not None and lp.token_id == token
            best = lp.top[0]
            if best[0] == token:
                chosen += 1
            else:
                margins_.append(round(best[2] - lp.logprob, 3))
    total = sum(len(t) for t in theirs)
    return {"peer_tokens": total, "engine_chose_the_same": chosen, "share": round(chosen / total, 4),
            "margins_where_not_nats": sorted(margins_),
            "margin_median_nats": statistics.median(margins_) if margins_ else None}


def float_copy(model: Path, out: Path) -> Path:
    """`model` with every tensor dequantized to float32 (gguf-py's reference dequantization: the values the engine's
    `none` serves) and its header (architecture, hyperparameters, tokenizer) as it is."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(model)
    writer = gguf.GGUFWriter(out, str(reader.fields["general.architecture"].contents()))
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:  # the writer places the tensors by it, and writes the key itself
        writer.add_custom_alignment(int(alignment.contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.alignment"):
            continue  # the writer writes these itself
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape)]
        writer.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@contextlib.contextmanager
def one_ulp(engine: LLMEngine) -> Iterator[None]:
    """Inside: the first decoder layer's input-norm weights raised by one float32 ulp each, in place (the C decode
    stack reads the same storage); restored on exit."""
    model = engine.runner.model
    assert isinstance(model, LlamaForCausalLM), "a model in this process"
    weight = model.layers[0].input_layernorm.weight
    before = weight.detach().clone()
    with torch.no_grad():
        weight.copy_(torch.nextafter(before, torch.full_like(before, torch.inf)))
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(before)


def greedy_tokens(engine: LLMEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Each prompt continued greedily for exactly `new_tokens` tokens (EOS ignored)."""
    got = run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True))
    return [[t for t in g if isinstance(t, int)] for g in got]


def engine_side(model: Path, quantization: str, prompts: list[list[int]], new_tokens: int) -> tuple[LLMEngine, list[list[int]]]:
    engine = LLMEngine(EngineConfig(model=str(model), quantization=quantization, enable_prefix_caching=False))
    return engine, greedy_tokens(engine, prompts, new_tokens)


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
    auto_engine, auto_tokens = engine_side(args.model, "auto", prompts, args.new_tokens)
    sides = {"auto": auto_tokens, "none": none_tokens}
    result: dict[str, Any] = {"bench": "peer_agreement", "model": args.model.name, "prompts": len(prompts),
                              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
                              "auto_vs_none": agreement(sides["auto"], sides["none"], args.new_tokens)}
    for name, engine in (("auto", auto_engine), ("none", none_engine)):
        with one_ulp(engine):
            nudged = greedy_tokens(engine, prompts, args.new_tokens)
        result[f"{name}_vs_{name}_one_ulp"] = agreement(sides[name], nudged, args.new_tokens)
    theirs: list[list[int]] | None = None
    if args.peer_url:  # a llama-server already running on the same file (its native /completion)
        theirs = peer_continuations(args.peer_url.rstrip("/"), prompts, args.new_tokens)
        result["peer"] = {"status": "measured", "peer": "llama-server", "url": args.peer_url, "gguf": str(args.model)}
    elif args.llama_server is not None:
        ctx = args.prompt_tokens + args.new_tokens + 64
        with peer.llama_server(args.llama_server, args.model, args.threads, 1, ctx_per_slot=ctx) as url:
            theirs = peer_continuations(url, prompts, args.new_tokens)
        result["peer"] = {"status": "measured", "peer": "llama-server", "binary": str(args.llama_server),
                          "version": peer.peer_version(args.llama_server), "gguf": str(args.model)}
        with tempfile.TemporaryDirectory() as tmp:
            floats = float_copy(args.model, Path(tmp) / "float32.gguf")
            with peer.llama_server(args.llama_server, floats, args.threads, 1, ctx_per_slot=ctx) as url:
                theirs_float = peer_continuations(url, prompts, args.new_tokens)
        result["peer_vs_peer_float"] = agreement(theirs, theirs_float, args.new_tokens)
        with peer.llama_server(args.llama_server, args.model, args.threads, 1, ctx_per_slot=ctx,
                               extra=("-fa", "off")) as url:
            result["peer_vs_peer_fa_off"] = agreement(theirs, peer_continuations(url, prompts, args.new_tokens),
                                                      args.new_tokens)
        result["float_vs_peer_float"] = agreement(sides["none"], theirs_float, args.new_tokens)
        result["float_vs_peer_float"]["teacher_forced"] = teacher_forced(none_engine, prompts, theirs_float)
    else:
        result["peer"] = peer.absent()
    if theirs is not None:
        result["auto_vs_peer"] = agreement(sides["auto"], theirs, args.new_tokens)
        forks = margins(auto_engine, prompts, sides["auto"], theirs)
        result["auto_vs_peer"]["fork_margins_nats"] = sorted(forks)
        if forks:
            result["auto_vs_peer"]["fork_margin_median_nats"] = statistics.median(forks)
        result["none_vs_peer"] = agreement(sides["none"], theirs, args.new_tokens)
        result["teacher_forced"] = teacher_forced(auto_engine, prompts, theirs)
    for key in ("auto_vs_peer", "none_vs_peer", "auto_vs_none", "teacher_forced", "peer_vs_peer_float",
                "peer_vs_peer_fa_off", "float_vs_peer_float", "auto_vs_auto_one_ulp", "none_vs_none_one_ulp"):
        if key in result:
            print(key, result[key], flush=True)
    return emit(result, args.out or default_out("peer_agreement"))


if __name__ == "__main__":
    main()
