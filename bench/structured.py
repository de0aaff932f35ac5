"""Constrained decoding cost and correctness: per-token overhead at 1 and 32 streams, grammar compile
time (cold and cached), and the share of constrained outputs that validate.

    python -m bench.structured [--streams 1,32] [--new-tokens 32] [--valid-requests 24] [--quantization auto|awq|none]

Overhead: the same N chat prompts decode --new-tokens tokens (greedy, ignore_eos) unconstrained and
then constrained to stay inside a JSON string (the costliest lexeme to mask: almost any token may
continue it; a schema's keys and punctuation are cheaper), in one LLMEngine on this machine. Tokens/s is
counted over decode steps only (from the first step after every prompt has been prefilled).
Validity: --valid-requests requests over several schemas (sampled, temperature 0.8) in one batch;
each output must parse and validate with jsonschema. The last line printed is one JSON object (also
bench/results/structured.json).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from jsonschema import Draft202012Validator

from backend.config import EngineConfig
from backend.engine.guided import GrammarCache, grammar_text
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template
from bench.report import default_out, emit

# The inside of a JSON string that never closes: the costliest lexeme to mask (almost any token may
# continue it), and the output never completes, so both runs decode the same number of tokens.
OPEN_STRING = r'start: "\"" TEXT' + "\n" + r'TEXT: /[^"\\\x00-\x1f]*/'
SCHEMAS: dict[str, dict[str, Any]] = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "order": {
        "type": "object",
        "properties": {
            "status": {"enum": ["new", "paid", "shipped"]},
            "items": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 6},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["status", "items"],
        "additionalProperties": False,
    },
    "flags": {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["ok", "score"],
        "additionalProperties": False,
    },
}
QUESTIONS = ["Describe a person.", "Write an order.", "Rate this idea.", "Tell me about the sea.", "Explain rain."]


def _prompt(engine: LLMEngine, i: int) -> list[int]:
    return apply_chat_template(
        engine.tokenizer, [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + " Answer in JSON."}]
    )


def decode_tokens_per_s(engine: LLMEngine, streams: int, params: SamplingParams, tag: str) -> float:
    for i in range(streams):
        engine.add_request(f"{tag}-{i}", _prompt(engine, i), params)
    start, counted = None, 0
    while engine.has_work:
        outs = engine.step()
        n = sum(len(d.token_ids) for o in outs for d in o.deltas)
        if start is not None:
            counted += n
        elif all(s.num_output_tokens > 0 for seqs in engine.requests.values() for s in seqs) and engine.requests:
            start = time.perf_counter()
    return counted / (time.perf_counter() - start) if start else 0.0


def compile_times(engine: LLMEngine) -> dict[str, dict[str, float]]:
    cache = GrammarCache(engine.tokenizer, engine.vocab_size)  # cold: nothing compiled yet
    out = {}
    for name, schema in SCHEMAS.items():
        grammar = grammar_text(SamplingParams(guided_json=json.dumps(schema)))
        assert grammar is not None
        t0 = time.perf_counter()
        cache.template(grammar)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        cache.new_matcher(SamplingParams(guided_json=json.dumps(schema)))
        cached = time.perf_counter() - t0
        out[name] = {"cold_ms": round(cold * 1e3, 2), "cached_ms": round(cached * 1e3, 3)}
    return out


def valid_share(engine: LLMEngine, requests: int) -> dict[str, float]:
    names = list(SCHEMAS)
    for i in range(requests):
        schema = SCHEMAS[names[i % len(names)]]
        params = SamplingParams(max_tokens=96, temperature=0.8, seed=i, guided_json=json.dumps(schema))
        engine.add_request(f"v-{i}", _prompt(engine, i), params)
    texts: dict[str, str] = {}
    while engine.has_work:
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + "".join(d.text for d in out.deltas)
    valid = 0
    for i in range(requests):
        try:
            Draft202012Validator(SCHEMAS[names[i % len(names)]]).validate(json.loads(texts[f"v-{i}"]))
            valid += 1
        except Exception:  # unparsable or invalid: both count against the share
            print(f"invalid: {texts[f'v-{i}']!r}")
    return {"requests": requests, "valid": valid, "share": valid / requests}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default="1,32")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--valid-requests", type=int, default=24)
    ap.add_argument("--quantization", default="auto", choices=["auto", "awq", "none"])
    args = ap.parse_args(argv)
    engine = LLMEngine(EngineConfig(max_num_seqs=64, quantization=args.quantization))
    free = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    guided = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True, guided_grammar=OPEN_STRING)
    decode_tokens_per_s(engine, 1, free, "warm")  # warm-up (and the long-string grammar compile)
    decode_tokens_per_s(engine, 1, guided, "warm-g")
    overhead = {}
    for streams in (int(s) for s in args.streams.split(",")):
        base = decode_tokens_per_s(engine, streams, free, f"free{streams}")
        con = decode_tokens_per_s(engine, streams, guided, f"guided{streams}")
        pct = round(100 * (1 - con / base), 1) if base else None
        overhead[str(streams)] = {"unconstrained_tok_s": round(base, 1), "constrained_tok_s": round(con, 1), "overhead_pct": pct}
        print(f"{streams:3d} streams: unconstrained {base:7.1f} tok/s, constrained {con:7.1f} tok/s, overhead {pct}%")
    compiles = compile_times(engine)
    for name, c in compiles.items():
        print(f"compile {name:7s}: cold {c['cold_ms']:.1f} ms, cached {c['cached_ms']:.3f} ms")
    validity = valid_share(engine, args.valid_requests)
    print(f"valid outputs: {validity['valid']}/{validity['requests']}")
    emit({"bench": "structured", "quantization": args.quantization, "overhead": overhead, "compile": compiles,
          "validity": validity, "library": "llguidance"},
         default_out("structured"))


if __name__ == "__main__":
    main()
