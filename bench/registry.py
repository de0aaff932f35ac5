"""The benchmark suite's members: each bench module with its full and quick arguments (bench/suite.py runs them,
bench/tables.py lists the ones without results)."""

from __future__ import annotations

import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Bench:
    name: str  # the module bench.NAME; it writes bench/results/NAME.json
    args: tuple[str, ...] = ()  # the full run
    quick: tuple[str, ...] = ()  # the smoke run
    peer: bool = False  # takes the peer flags (--llama-server, --peer-url, ...)
    quantization: bool = False  # takes --quantization auto|awq|none
    what: str = ""

    def argv(self, quick: bool) -> list[str]:
        return [sys.executable, "-m", f"bench.{self.name}", *(self.quick if quick else self.args)]


# Cheapest first, so a smoke run on a slow machine has the most figures by the time it is stopped.
SUITE: tuple[Bench, ...] = (
    Bench("cache_pairs", what="semantic-cache quality by similarity threshold"),
    Bench("request_types", (), ("--iterations", "500", "--rounds", "1"), what="declared request bodies: pydantic vs msgspec"),
    Bench("gateway_overhead", ("--requests", "2000"), ("--requests", "200", "--concurrency", "1", "16"),
          what="latency the gateway adds over the engine, requests/s"),
    Bench("stream_http", ("--streams", "1,8"), ("--requests", "1", "--new-tokens", "16"),
          what="one chat stream over HTTP: tokens/s, ITL, server CPU per token by thread"),
    Bench("throughput", (), ("--quick",), peer=True, quantization=True,
          what="tokens/s, TTFT, ITL; HF generate and llama.cpp's server"),
    Bench("prefill", (), ("--lengths", "128", "--reps", "1"), peer=True, quantization=True,
          what="time to first token, 128/512/2,000-token prompts over HTTP; llama.cpp's server"),
    Bench("prefill_attention", (), ("--lengths", "20,100", "--reps", "1"), quantization=True,
          what="prefill attention: per-token kernel vs SDPA"),
    Bench("kv_dtype", ("--batch", "32", "--steps", "120"), ("--batch", "4", "--steps", "10"), quantization=True,
          what="decode step time, fp32 vs bf16 KV cache"),
    Bench("cpu_kernels", (), ("--batches", "4", "--steps", "5", "--ppl-tokens", "-1"), quantization=True,
          what="the C kernels vs torch's ops: step time, perplexity"),
    Bench("int8_peak", (), (), what="the CPU's int8 multiply-add rate with the GEMMs' instructions: their roof"),
    Bench("huge_pages", (), ("--batches", "1", "--steps", "10"), what="the LM head on 2 MB pages vs 4 KB: decode steps"),
    Bench("profile_step", ("--batch", "32"), ("--batch", "4", "--steps", "5", "--profile-steps", "2"), quantization=True,
          what="where a decode step goes, by op"),
    Bench("gemm", (), ("--batches", "1", "--steps", "3"), what="prepacked oneDNN GEMM vs F.linear"),
    Bench("gguf_layouts", (), ("--rows", "1", "--reps", "5"), what="a GGUF's 4-bit values in the grouped GEMM: int8 vs nibbles"),
    Bench("structured", (), ("--streams", "1,4", "--new-tokens", "8", "--valid-requests", "4"), quantization=True,
          what="constrained decoding overhead, compile time, validity"),
    Bench("cache", (), ("--hits", "20"), what="semantic-cache quality on the held-out split, hit latency over HTTP"),
    Bench("awq", ("--threads", "1"), ("--streams", "1", "--new-tokens", "8", "--rounds", "1", "--window", "128"),
          what="AWQ INT4 vs RTN vs fp32: perplexity, decode speed"),
    Bench("gguf_models", (), ("--quick",), what="another architecture's GGUF (Gemma 3 270M): start, memory, speed, quality"),
    Bench("kv_window", (), ("--tokens", "300", "--new-tokens", "4"),
          what="KV memory with the windowed layers' own pool vs one pool (Gemma 3 270M)"),
    Bench("peer_agreement", (), ("--quick",), peer=True,
          what="greedy continuations of a GGUF against llama.cpp's server on the same file"),
    Bench("quant", ("--threads", "1"),
          ("--streams", "1", "--new-tokens", "8", "--rounds", "1", "--window", "128", "--no-gptq"),
          what="fp32, INT8, AWQ INT4, GPTQ: perplexity, decode speed"),
    Bench("speculative", (),
          ("--new-tokens", "16", "--batches", "", "--streams", "0", "--rounds", "1", "--methods", "ngram,reference"),
          what="n-gram, reference, draft, Medusa speculation vs plain decoding"),
    Bench("pipeline", (), ("--prompts", "4", "--new-tokens", "8"), what="pipeline parallelism pp=2 vs pp=1"),
    Bench("routing", (), ("--requests", "8", "--concurrency", "4", "--max-tokens", "8", "--rounds", "1", "--hops", "5",
                          "--recovery-s", "6", "--cooldown-s", "2"),
          what="1 vs 2 replicas behind the router, added latency, recovery"),
    Bench("overload", (), ("--phase-s", "5", "--max-tokens", "8"), what="2x and 4x the sustainable rate: 429s, latency"),
    Bench("soak", ("--minutes", "10"), ("--minutes", "1", "--concurrency", "2"), what="mixed traffic: errors, leaks, RSS"),
    Bench("kernels", what="Triton kernels: correctness (interpreter without a GPU), timings on CUDA"),
)  # fmt: skip
BY_NAME = {b.name: b for b in SUITE}
