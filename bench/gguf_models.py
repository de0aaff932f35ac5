"""A GGUF of another architecture as a user brings it (Gemma 3 270M Q4_K_M by default): start-up, memory, speed, quality.

    python -m bench.gguf_models [--model FILE.gguf] [--streams 1,32] [--new-tokens 64] [--rounds 2] [--window 256]
                                [--max-windows 16] [--no-cold] [--quick] [--llama-server PATH]

What it measures, in one run on this machine:

- the header read (architecture, tensor types) and, with a cache folder of its own (`--no-cold` skips it), the one-time
  conversion and the first engine load: what a cold `python -m gateway` spends before it is ready (the gateway's own
  start, the embedding model and the HTTP server add a few seconds, not measured here);
- per serving copy: `none` (the file dequantized to float32, the reference), `int8` (dequantized, then re-quantized to
  INT8 per channel at load: what `auto` served before the file's own bits were) and `auto` (what `make serve` serves:
  the file's blocks in their own bits, backend/quant/gguf_grouped.py): load time, the resident memory the engine adds
  to a process of its own (as a server holds it) and the bytes of the weights it holds, each against the file's size,
  and the rest of that memory (the rope tables' computed rows; the remainder, mostly the tokenizer), perplexity on
  backend/quant/data/heldout.txt
  (non-overlapping windows, prompt log-probabilities through the engine), and decode tok/s at each --streams level
  (completion prompts, greedy, ignore_eos, the clock from the moment every stream has its first token), the two copies
  measured back to back each round, their ratio the median of the rounds.

With --llama-server PATH (llama.cpp's server, built as docs/benchmarks.md says), the peer's memory on the same file is
measured beside the engine's: its whole process's resident memory after load and one short completion (one slot of
512 positions, so its KV cache is a few MB; the file's pages are mapped, file-backed), against the file's size. The
engine's own figures are the memory a load adds to a Python process whose imports are done (`rss_added_mb`) and that
process's whole resident memory (`process_rss_mb`: Python, torch and the libraries on top). The peer's speed on this
file is bench.throughput's (`--peer-gguf`). The last line printed is one JSON object, also written to
bench/results/gguf_models.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, release_freed_memory
from backend.engine.sampling_params import SamplingParams
from bench.awq import perplexity
from bench.report import default_out, emit

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "The three primary colors are",
           "def fibonacci(n):", "Water boils at a temperature of", "The most important rule of cooking is",
           "In 1969, the first people to walk on the Moon", "A good way to learn a new language is"]


def rss_mb() -> float:
    """This process's resident memory (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(model: Path, quantization: str) -> tuple[LLMEngine, dict[str, Any]]:
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(model=str(model), quantization=quantization, enable_prefix_caching=False))
    info = {"load_s": round(time.perf_counter() - t0, 2), **load_memory(model, quantization),
            "kv_pool_mb": round(engine.runner.kv_bytes / 2**20, 1),  # zero pages: resident once written
            "layers": sorted(set(engine.output_identity["layers"]))}
    return engine, info


def load_memory(model: Path, quantization: str) -> dict[str, float]:
    """`measure_load` in a process of its own, as a server holds its engine: in this one the engines loaded before
    left freed heap that a later load reuses (Gemma 3's `auto` measured 333 MB third in line, 425 MB alone)."""
    name = measure_load.__name__
    code = f"import json; from pathlib import Path; from bench.gguf_models import {name}; " \
           f"print(json.dumps({name}(Path({str(model)!r}), {quantization!r})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_load(model: Path, quantization: str) -> dict[str, float]:
    """The resident memory a load adds to a process whose imports are done and whose heap is trimmed, and what it is:
    the weights, the rope tables' computed rows (on a CPU, as positions are served: none yet) and the rest (mostly
    the tokenizer's Rust tables)."""
    gc.collect()
    release_freed_memory()
    before = rss_mb()
    engine = LLMEngine(EngineConfig(model=str(model), quantization=quantization, enable_prefix_caching=False))
    gc.collect()
    added, served = rss_mb() - before, engine.runner.model
    weights, rope = weight_bytes(served) / 2**20, rope_bytes(served) / 2**20
    return {"rss_added_mb": round(added, 1), "process_rss_mb": round(before + added, 1), "weights_mb": round(weights, 1),
            "rope_mb": round(rope, 1), "other_mb": round(added - weights - rope, 1)}


def peer_memory(binary: Path, model: Path, file_mb: float) -> dict[str, Any]:
    """llama-server's resident memory on `model` after load and one 8-token completion (its compute buffers are
    allocated by then), one slot of 512 positions, on torch's thread count."""
    import httpx

    from bench import peer

    with peer.llama_server_process(binary, model, torch.get_num_threads(), 1, ctx_per_slot=512) as (url, proc):
        httpx.post(f"{url}/completion", json={"prompt": PROMPTS[0], "n_predict": 8}, timeout=120).raise_for_status()
        memory = peer.resident_mb(proc.pid)
    return {"version": peer.peer_version(binary), "ctx": 512, **memory,
            "memory_over_file": round(memory["rss_mb"] / file_mb, 2)}


def rope_bytes(model: torch.nn.Module) -> int:
    """Bytes of the rope tables: on a CPU the rows computed so far (backend/model/rope.py), on a GPU every position's."""
    from backend.model.rope import RotaryEmbedding

    return sum(m.cos_sin.nbytes for m in model.modules() if isinstance(m, RotaryEmbedding))


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every weight the model holds (parameters, buffers, and the quantized layers' tensors kept as attributes
    or in dataclasses), each storage counted once (a tied head shares the embedding's); not the rope tables (angles,
    not in the file: `rope_bytes`)."""
    from backend.model.rope import RotaryEmbedding

    seen: dict[int, int] = {}
    ropes = {t.untyped_storage().data_ptr() for m in model.modules() if isinstance(m, RotaryEmbedding) for t in m.buffers()}

    def add(t: object) -> None:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    for module in model.modules():
        for value in vars(module).values():
            add(value)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                for f in dataclasses.fields(value):
                    add(getattr(value, f.name))
        for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
            add(t)
    return sum(n for ptr, n in seen.items() if ptr not in ropes)


def decode_tok_s(engine: LLMEngine, streams: int, new_tokens: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    for i in range(streams):
        ids = engine.tokenizer.encode(PROMPTS[i % len(PROMPTS)])
        engine.add_request(f"d{streams}-{i}-{time.monotonic_ns()}", ids, params)
    started: set[str] = set()
    while len(started) < streams:
        started.update(o.request_id for o in engine.step() if any(d.token_ids for d in o.deltas))
    tokens, start = 0, time.perf_counter()
    while engine.has_work:
        tokens += sum(len(d.token_ids) for o in engine.step() for d in o.deltas)
    return tokens / (time.perf_counter() - start)


def cold_start(model: Path) -> dict[str, Any]:
    """Header, conversion and first load with an empty cache folder (the file converted as on a first start)."""
    from backend.quant.gguf_header import read_header

    t0 = time.perf_counter()
    header = read_header(model)
    header_ms = (time.perf_counter() - t0) * 1e3
    old = os.environ.get("SMOLGATE_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SMOLGATE_CACHE"] = tmp
        try:
            t0 = time.perf_counter()
            engine = LLMEngine(EngineConfig(model=str(model)))
            total = time.perf_counter() - t0
            del engine
        finally:
            if old is None:
                os.environ.pop("SMOLGATE_CACHE", None)
            else:
                os.environ["SMOLGATE_CACHE"] = old
    return {"header_ms": round(header_ms, 1), "architecture": header.architecture,
            "tensor_types": dict(header.tensor_types), "convert_and_load_s": round(total, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.gguf_models", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a .gguf file (default: Gemma 3 270M Q4_K_M, fetched)")
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--max-windows", type=int, default=16)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold start (conversion into a fresh cache)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 1 stream, 8 tokens, 2 windows, no cold start")
    ap.add_argument("--llama-server", type=Path, default=None, help="llama.cpp's server: its memory on the same file")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.streams, args.new_tokens, args.rounds, args.max_windows, args.no_cold = "1", 8, 1, 2, True
    if args.model is None:
        from backend.fetch import fetch_gemma_gguf

        args.model = fetch_gemma_gguf()
    levels = [int(s) for s in args.streams.split(",")]
    result: dict[str, Any] = {"bench": "gguf_models", "model": args.model.name,
                              "file_mb": round(args.model.stat().st_size / 2**20, 1), "mode": "quick" if args.quick else "full"}
    if not args.no_cold:
        result["cold_start"] = cold_start(args.model)
        print("cold start:", result["cold_start"], flush=True)
    if args.llama_server:
        result["peer_memory"] = peer_memory(args.llama_server, args.model, result["file_mb"])
        print("llama-server:", result["peer_memory"], flush=True)
    from backend.quant.calibration import HELDOUT

    engines, copies = {}, {}
    for q in ("none", "int8", "auto"):
        engines[q], copies[q] = load(args.model, q)
        text_ids = engines[q].tokenizer.encode(HELDOUT.read_text(), add_special_tokens=False)
        bos = engines[q].tokenizer.bos_token_id
        ppl, scored = perplexity(engines[q], text_ids, args.window, () if bos is None else (bos,), max_windows=args.max_windows)
        copies[q].update({"perplexity": round(ppl, 4), "scored_tokens": scored,
                          "memory_over_file": round(copies[q]["rss_added_mb"] / result["file_mb"], 2),
                          "weights_over_file": round(copies[q]["weights_mb"] / result["file_mb"], 2)})
        print(q, copies[q], flush=True)
    speed: dict[str, dict[str, list[float]]] = {q: {str(s): [] for s in levels} for q in engines}
    for _ in range(args.rounds):
        for s in levels:
            for q, engine in engines.items():  # back to back, so load changes hit both alike
                speed[q][str(s)].append(decode_tok_s(engine, s, args.new_tokens))
                print(f"decode {q:5s} streams={s:<3d} {speed[q][str(s)][-1]:8.1f} tok/s", flush=True)
    for q in engines:
        copies[q]["decode_tok_s"] = {s: round(max(v), 1) for s, v in speed[q].items()}
    result["copies"] = copies
    for q in ("int8", "auto"):
        result[f"{q}_over_none"] = {
            "decode": {s: round(statistics.median(a / b for a, b in zip(speed[q][s], speed["none"][s], strict=True)), 2)
                       for s in speed["none"]},
            "perplexity_change": round(copies[q]["perplexity"] / copies["none"]["perplexity"] - 1, 4),
        }
    emit(result, args.out or default_out("gguf_models"))


if __name__ == "__main__":
    main()
