"""python -m bench.speculative: n-gram, reference-text and draft-model speculation vs plain decoding.

The target is the full-precision default model; the draft model is its INT4 copy (the GGUF's blocks); the Medusa heads are
the self-distilled ones (trained first by backend.spec.medusa_train if the cache has none). Every figure is a
ratio inside one run (the machine is shared): the same greedy requests go through a plain engine and
each speculating engine, interleaved prompt group by prompt group, and the outputs are checked to be identical.
Each ratio is given in wall time (`speedup`) and in process CPU time (`cpu_speedup`: with one thread, the work done,
which other jobs' load inflates far less than the wall time).

- single stream, one request at a time: (a) `rag`: summarisation / RAG prompts that quote their context,
  (b) `chat`: open chat prompts. Methods: ngram, reference (the answer to a paraphrased question handed
  in as `spec_reference`, as the gateway does with a semantic-cache near miss), draft, medusa.
- batch sweep: B concurrent chat+rag requests with speculation forced on (no `speculative_max_batch`
  limit) vs off: where speculation stops paying, which sets the `speculative_max_batch` default.
- 32 streams with the default settings (speculation turns itself off above `speculative_max_batch`).
- adaptive on vs off: the default engine configuration (speculation on, the adaptive policy; `num_speculative_tokens`
  4 if a configuration turns it off) against the same with `num_speculative_tokens: 0`, on chat and RAG prompts at
  1 and 32 streams; and `row_cost`,
  what one more verified row adds to a one-sequence decode step (the `speculative_row_cost` setting).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from backend.config import EngineConfig, default_medusa_path
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import ScheduledSeq, SchedulerOutput
from backend.model.tokenizer import apply_chat_template
from bench.report import default_out, emit

PASSAGE = (
    "The Amazon rainforest covers about 5.5 million square kilometres across nine countries. It produces a large "
    "share of the world's oxygen and is home to roughly ten percent of all known species. Deforestation, mainly "
    "for cattle ranching and soy farming, has removed about seventeen percent of the forest in the last fifty years."
)
NOTES = (
    "Meeting notes: the team agreed to ship version 2.4 on Friday. Alice will update the release notes. Bob will "
    "fix the login bug before Thursday. The database migration is postponed to next sprint because of the holidays."
)
RAG = [
    f"Context:\n{PASSAGE}\n\nUsing only the context, how much of the Amazon has been removed, and why?",
    f"Summarise the following notes in a few sentences.\n\n{NOTES}",
    f"Repeat the key facts of this text as a bullet list:\n{PASSAGE}",
]
CHAT = ["Write a short poem about the sea.", "Give me three tips for learning to code.", "Why is the sky blue?"]
MORE_CHAT = ["What is the capital of France?", "Explain gravity in one sentence.", "List three fruits.",
             "Who wrote Romeo and Juliet?", "How do I boil an egg?", "What does CPU stand for?",
             "Tell me a fun fact about octopuses.", "Describe a cat in five words."]
PARAPHRASES = ["Write a short poem about the ocean.", "What are three tips for learning programming?",
               "Why does the sky look blue?"]


def run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[list[list[int]], float]:
    """All prompts submitted at once; returns their outputs and the wall time until the last finished."""
    for i, (p, sp) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"r{i}", p, sp)
    tokens: dict[str, list[int]] = {}
    start = time.perf_counter()
    while engine.has_work:
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(t for d in out.deltas for t in d.token_ids)
    return [tokens[f"r{i}"] for i in range(len(prompts))], time.perf_counter() - start


def compare(
    plain: LLMEngine, spec: dict[str, LLMEngine], prompts: list[list[int]], params: list[SamplingParams],
    *, groups: list[list[int]], rounds: int, extra: dict[str, list[SamplingParams]] | None = None,
) -> dict:
    """Each group of prompts runs through plain, then every method, group after group (interleaved, so
    load changes on the shared machine hit all engines alike; every other round in reverse order), `rounds` times.
    `extra`: a method's own params."""
    engines = {"plain": plain, **spec}
    seconds = dict.fromkeys(engines, 0.0)
    cpu = dict.fromkeys(engines, 0.0)  # process CPU time: on a shared machine, what other jobs' load leaves out
    counts = {name: [0, 0, 0] for name in engines}  # proposed, accepted, verifications
    outs: dict[str, dict[int, list[int]]] = {name: {} for name in engines}
    for r in range(rounds):
        for group in groups:
            # every other round in reverse order: the engine that runs first after another's run (cold caches, a
            # load change) is not always the same one
            for name, engine in list(engines.items())[:: -1 if r % 2 else 1]:
                ps = (extra or {}).get(name, params)
                st = engine.speculator.stats
                before = st.proposed, st.accepted, st.verifications
                start_cpu = time.process_time()
                out, secs = run(engine, [prompts[i] for i in group], [ps[i] for i in group])
                seconds[name] += secs
                cpu[name] += time.process_time() - start_cpu
                outs[name].update(zip(group, out, strict=True))
                for j, now in enumerate((st.proposed, st.accepted, st.verifications)):
                    counts[name][j] += now - before[j]
    tokens = rounds * sum(len(o) for o in outs["plain"].values())
    result: dict = {"plain_tok_s": round(tokens / seconds["plain"], 2)}
    for name in spec:
        proposed, accepted, verifications = counts[name]
        result[name] = {
            "tok_s": round(tokens / seconds[name], 2), "speedup": round(seconds["plain"] / seconds[name], 3),
            "cpu_speedup": round(cpu["plain"] / cpu[name], 3),
            "acceptance_rate": round(accepted / proposed, 3) if proposed else 0.0,
            "tokens_per_verify": round((accepted + verifications) / verifications, 2) if verifications else 1.0,
            "mean_acceptance_length": round(accepted / verifications, 2) if verifications else 0.0,
            "identical": outs[name] == outs["plain"],
        }
    return result


def row_cost(engine: LLMEngine, prompt: list[int], k: int, reps: int) -> dict:
    """What k more rows (a verified draft) add to a one-sequence decode step, per row, as a fraction of the step:
    the same sequence's forward with 1 row and with 1 + k, alternated, medians."""
    engine.add_request("row-cost", prompt, SamplingParams(max_tokens=k + 2, ignore_eos=True, speculate=False))
    engine.step()  # the prompt's prefill: the sequence now has one token to decode
    seq = engine.scheduler.running[0]
    seq.token_ids.extend([seq.token_ids[-1]] * k)
    seq.num_draft = k
    assert engine.kv.allocate_slots(seq, 1 + k)
    times: dict[int, list[float]] = {1: [], 1 + k: []}
    for _ in range(reps):
        for n in times:  # the KV of these positions is simply rewritten
            start = time.perf_counter()
            engine.runner.run(SchedulerOutput(decodes=[ScheduledSeq(seq, n)]))
            times[n].append(time.perf_counter() - start)
    seq.drop_draft()
    engine.abort("row-cost")
    one, many = statistics.median(times[1]), statistics.median(times[1 + k])
    return {"step_ms": round(one * 1e3, 2), f"step_{1 + k}_rows_ms": round(many * 1e3, 2),
            "row_cost": round((many - one) / (k * one), 3)}


def default_on_vs_off(args: argparse.Namespace) -> dict:
    """The default configuration (the adaptive policy; k 4 where the defaults turn speculation off) against it with
    speculation off, chat and RAG prompts, 1 and 32 streams."""
    on = LLMEngine(EngineConfig(quantization=args.quantization, num_threads=args.threads, kv_cache_memory_mb=512,
                                num_speculative_tokens=EngineConfig.num_speculative_tokens or 4))
    off = LLMEngine(replace(on.config, num_speculative_tokens=0))
    tok = on.tokenizer
    chat = lambda q: apply_chat_template(tok, [{"role": "user", "content": q}])  # noqa: E731
    run(off, [chat("Hello")], [SamplingParams(max_tokens=4)])  # warm-up
    run(on, [chat("Hello")], [SamplingParams(max_tokens=4)])
    results: dict = {"default_row_cost": row_cost(off, chat(CHAT[0]), on.config.num_speculative_tokens, args.row_cost_reps),
                     "default_k": on.config.num_speculative_tokens,
                     "default_speculative_max_batch": on.config.speculative_max_batch,
                     "default_speculative_row_cost": on.config.speculative_row_cost}
    for case, questions in (("chat", CHAT + MORE_CHAT), ("rag", RAG)):
        for streams in (1, args.default_streams):
            prompts = [chat(questions[i % len(questions)]) for i in range(max(streams, len(questions)))]
            params = [SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)] * len(prompts)
            groups = [[i] for i in range(len(questions))] if streams == 1 else [list(range(streams))]
            results[f"default_{case}_{streams}"] = compare(off, {"default": on}, prompts, params, groups=groups,
                rounds=args.rounds)
    return results


def medusa_heads(train_seconds: float) -> tuple[Path, float]:
    """The self-distilled heads, trained now (2 threads) if the cache has none; (path, seconds spent training)."""
    path = default_medusa_path()
    if (path / "config.json").exists():
        return path, 0.0
    from backend.spec import medusa_train

    start = time.perf_counter()
    medusa_train.main(["--seconds", str(train_seconds), "--threads", "2"])
    seconds = time.perf_counter() - start
    print(f"trained Medusa heads in {seconds:.0f}s (features + training + heldout check)")
    return path, seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    parser.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes of the sweep ('' to skip)")
    parser.add_argument("--sweep-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of every comparison")
    parser.add_argument("--streams", type=int, default=32, help="streams of the default-settings run (0 to skip)")
    parser.add_argument("--methods", default="ngram,reference,draft,medusa", help="which to compare with plain")
    parser.add_argument("--medusa-k", type=int, default=0, help="draft tokens per step for medusa (0: --k)")
    parser.add_argument("--medusa-min-confidence", type=float, default=EngineConfig.medusa_min_confidence,
                        help="EngineConfig.medusa_min_confidence")
    parser.add_argument("--medusa-train-seconds", type=float, default=150, help="training budget when no heads are cached")
    parser.add_argument("--quantization", default=EngineConfig.quantization, help="default-on-vs-off: the weights")
    parser.add_argument("--default-streams", type=int, default=32, help="default-on-vs-off: the many-streams case")
    parser.add_argument("--row-cost-reps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=default_out("speculative"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    results: dict = default_on_vs_off(args)
    wanted = set(args.methods.split(","))
    heads, train_seconds = medusa_heads(args.medusa_train_seconds) if "medusa" in wanted else (Path(), 0.0)

    base = EngineConfig(quantization="none", num_threads=args.threads, kv_cache_memory_mb=256, num_speculative_tokens=0)
    unlimited = {"speculative_max_batch": 10**6, "speculative_row_cost": 0.0}  # forced: k tokens at any batch size
    plain = LLMEngine(base)
    medusa = {"num_speculative_tokens": args.medusa_k or args.k, "speculative_method": "medusa",
              "speculative_model": str(heads), "medusa_min_confidence": args.medusa_min_confidence}
    configs = {"ngram": {"num_speculative_tokens": args.k}, "reference": {"num_speculative_tokens": args.k},
               "draft": {"num_speculative_tokens": args.k, "speculative_method": "draft"}, "medusa": medusa}
    engines: dict[str, LLMEngine] = {}
    for name in (n for n in configs if n in wanted):  # reference: the n-gram engine (if any), handed references
        engines[name] = engines["ngram"] if name == "reference" and "ngram" in engines else \
            LLMEngine(EngineConfig(**{**vars(base), **configs[name]}))
    streams = {name: e for name, e in engines.items() if name != "reference"}
    tok = plain.tokenizer
    chat = lambda q: apply_chat_template(tok, [{"role": "user", "content": q}])  # noqa: E731
    greedy = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    run(plain, [chat("Hello")], [SamplingParams(max_tokens=4)])  # warm-up

    for case, questions in (("rag", RAG), ("chat", CHAT)) if engines else ():
        prompts = [chat(q) for q in questions]
        # the near miss: what the model answered to a paraphrase (for rag: the same question again)
        near = PARAPHRASES if case == "chat" else questions
        answers = [run(plain, [chat(q)], [greedy])[0][0] for q in near]
        with_ref = [SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True, spec_reference=tok.decode(a))
                    for a in answers]
        results[f"single_{case}"] = compare(
            plain, engines, prompts, [greedy] * len(prompts),
            groups=[[i] for i in range(len(prompts))], rounds=args.rounds, extra={"reference": with_ref},
        )

    mixed = [chat(q) for q in RAG + CHAT]
    sweep = SamplingParams(temperature=0, max_tokens=args.sweep_tokens, ignore_eos=True)
    forced = {name: LLMEngine(EngineConfig(**{**vars(base), "num_speculative_tokens": args.k, **unlimited, **method}))
              for name, method in (("ngram", {}), ("draft", {"speculative_method": "draft"}))} if args.batches else {}
    for b in [int(x) for x in args.batches.split(",") if x]:
        prompts = [mixed[i % len(mixed)] for i in range(b)]
        results[f"batch_{b}_forced"] = compare(plain, forced, prompts, [sweep] * b, groups=[list(range(b))], rounds=args.rounds)
    if args.streams:
        prompts = [mixed[i % len(mixed)] for i in range(args.streams)]
        results[f"streams_{args.streams}_default"] = compare(
            plain, streams, prompts, [sweep] * args.streams,
            groups=[list(range(args.streams))], rounds=args.rounds,
        )

    for name, r in results.items():
        if not isinstance(r, dict) or "plain_tok_s" not in r:
            print(f"{name:>22}: {r}")
            continue
        methods = "  ".join(f"{m} x{v['speedup']:.2f}, cpu x{v['cpu_speedup']:.2f} "
                            f"({v['tokens_per_verify']} tok/verify{'' if v['identical'] else ' DIFF'})"
                            for m, v in r.items() if isinstance(v, dict))
        print(f"{name:>22}: plain {r['plain_tok_s']:6.1f} tok/s  {methods}")
    summary = {"bench": "speculative", "k": args.k, "medusa_k": args.medusa_k or args.k,
               "medusa_min_confidence": args.medusa_min_confidence, "new_tokens": args.new_tokens,
               "threads": args.threads, "rounds": args.rounds,
               "torch_threads": torch.get_num_threads(), "medusa_train_seconds": round(train_seconds), **results}
    emit(summary, args.out)


if __name__ == "__main__":
    main()
