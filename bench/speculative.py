"""python -m bench.speculative: n-gram and reference-text speculation vs plain decoding, side by side.

Each case runs the same greedy requests through an engine without speculation and one with it (k
draft tokens per step) and reports tokens/s, their ratio, and the acceptance figures. Greedy output
is checked to be identical. Cases: copying text from the prompt (prompt lookup's home ground), a
reference answer handed in as the draft source (the semantic cache's near-miss), an open question
(little to copy), and batches of 8 and 32 (where speculation turns itself off above
`speculative_max_batch`).
"""

from __future__ import annotations

import argparse
import json
import time

from backend.config import EngineConfig
from backend.engine import LLMEngine
from backend.sampling_params import SamplingParams
from backend.tokenizer import apply_chat_template

TEXT = (
    "Speculative decoding lets a cheap proposer guess several tokens ahead; the large model then checks "
    "all of them in a single forward pass and keeps the longest prefix it agrees with. Because the check "
    "is exact, the output is unchanged, and every accepted guess saves one full decoding step."
)
CASES = {
    "copy": f"Repeat the following text exactly, word for word:\n{TEXT}",
    "open": "Write a short poem about the sea.",
}


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> tuple[list[list[int]], float]:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, params)
    tokens: dict[str, list[int]] = {}
    start = time.perf_counter()
    while engine.has_work:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(t for d in out.deltas for t in d.token_ids)
    return [tokens[f"r{i}"] for i in range(len(prompts))], time.perf_counter() - start


def compare(plain: LLMEngine, spec: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    before = spec.speculator.stats.proposed, spec.speculator.stats.accepted
    base_out, base_s = run(plain, prompts, params)
    spec_out, spec_s = run(spec, prompts, params)
    n = sum(len(t) for t in base_out)
    proposed = spec.speculator.stats.proposed - before[0]
    accepted = spec.speculator.stats.accepted - before[1]
    return {
        "plain_tok_s": round(n / base_s, 1),
        "spec_tok_s": round(n / spec_s, 1),
        "speedup": round(base_s / spec_s, 2),
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0,
        "identical": base_out == spec_out,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    plain = LLMEngine(EngineConfig(quantization="none"))
    spec = LLMEngine(EngineConfig(quantization="none", num_speculative_tokens=args.k))
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    chat = {name: apply_chat_template(plain.tokenizer, [{"role": "user", "content": q}]) for name, q in CASES.items()}
    run(plain, [chat["open"]], SamplingParams(max_tokens=4))  # warm-up
    results = {name: compare(plain, spec, [ids], params) for name, ids in chat.items()}
    answer = plain.tokenizer.decode(run(plain, [chat["open"]], params)[0][0])
    with_ref = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True, spec_reference=answer)
    results["reference"] = compare(plain, spec, [chat["open"]], with_ref)
    for batch in (8, 32):
        results[f"copy_batch_{batch}"] = compare(plain, spec, [chat["copy"]] * batch, params)
    for name, r in results.items():
        print(f"{name:>14}: {r['plain_tok_s']:7.1f} -> {r['spec_tok_s']:7.1f} tok/s  x{r['speedup']:<5} "
              f"accepted {r['accepted']}/{r['proposed']}  identical={r['identical']}")
    print(json.dumps({"bench": "speculative", "k": args.k, "new_tokens": args.new_tokens, **results}))


if __name__ == "__main__":
    main()
