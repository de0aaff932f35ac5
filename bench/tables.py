"""The benchmark tables in the docs, regenerated from bench/results/*.json: every row cites its file, machine and commit.

    python -m bench.tables [--results bench/results] [--docs docs/benchmarks.md] [--readme README.md]

docs/benchmarks.md gets the full table (the headline figures of every result file, then the machines they were
measured on, what the last suite run could not measure, and the plots) between `<!-- bench-results:start -->` and
`<!-- bench-results:end -->`; README.md gets a small table of the figures a user asks about first between
`<!-- bench-table:start -->` and `<!-- bench-table:end -->`. Text outside the markers is left alone; a file without
its markers is left alone too (the line printed says so). Nothing here is typed in: a figure whose result file is
missing is "not measured", a peer that was not run is "absent". The output depends only on the result files, so
running it twice changes nothing. `make bench` runs it after the suite (bench/suite.py). The last line printed is
a JSON list of the files rewritten.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.provenance import commit_label

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DOCS = REPO / "docs" / "benchmarks.md"
README = REPO / "README.md"
PLOTS = REPO / "bench" / "plots"
DOCS_MARK = "bench-results"
README_MARK = "bench-table"
HOW_TO_PEER = "absent: `make bench LLAMA_SERVER=/path/to/llama-server` measures it"

Figures = list[tuple[str, str]]  # (what, value) rows of one result file
Result = dict[str, Any]


# ---- formatting --------------------------------------------------------------------------------
def num(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if abs(x) >= 100:
            return f"{x:,.0f}"
        return f"{x:.{digits}f}" if abs(x) >= 1 or x == 0 else f"{x:.{max(digits, 2)}g}"
    return str(x)


def pct(x: Any) -> str:
    return "-" if x is None else f"{100 * float(x):.1f}%"


def streams(n: int | str) -> str:
    return f"{n} stream{'s' * (int(n) != 1)}"


def levels(result: Result, prefix: str) -> list[int]:
    return sorted(int(k[len(prefix):]) for k in result if k.startswith(prefix) and k[len(prefix):].isdigit())


# ---- the headline figures of each bench --------------------------------------------------------
def throughput(r: Result) -> Figures:
    quant, new = r.get("engine_quantization", "?"), r.get("new_tokens", "?")
    rows: Figures = []
    for n in levels(r, "engine_"):
        e = r[f"engine_{n}"]
        rows.append((f"engine ({quant}), {streams(n)}, {new} new tokens: tokens/s", num(e["tok_s"])))
        rows.append((f"engine ({quant}), {streams(n)}: TTFT p50 / ITL p50", f"{num(e['ttft_p50_ms'])} / "
                     f"{num(e['itl_p50_ms'])} ms"))
    hf = r.get("hf_sequential")
    hf_status = (r.get("hf") or {}).get("status", "measured" if hf else "absent")
    rows.append(("HF `generate` (full precision), one request at a time: tokens/s",
                 num(hf["tok_s"]) if hf else f"{hf_status}: install transformers"))
    peer = r.get("peer") or {}
    peer_levels = levels(r, "peer_")
    name = "llama.cpp's server" if peer.get("peer") == "llama-server" else str(peer.get("peer", "llama.cpp's server"))
    if peer.get("status") == "measured" and peer_levels:
        for n in peer_levels:
            rows.append((f"{name} ({peer.get('gguf', '?')}), {streams(n)}: tokens/s", num(r[f"peer_{n}"]["tok_s"])))
    else:
        rows.append(("llama.cpp's server, same prompts: tokens/s", HOW_TO_PEER))
    return rows


def gateway_overhead(r: Result) -> Figures:
    rows: Figures = []
    for key in sorted((k for k in r if k.startswith("c") and k[1:].isdigit()), key=lambda k: int(k[1:])):
        c, f = key[1:], r[key]
        clients = f"{c} client{'s' * (c != '1')}"
        rows.append((f"latency the gateway adds over the engine, {clients}: p50 / p99",
                     f"{num(f['added_p50_ms'], 2)} / {num(f['added_p99_ms'], 2)} ms"))
        rows.append((f"gateway requests/s, {clients} (non-streamed / streamed)",
                     f"{num(f['gateway_rps'])} / {num(f['gateway_stream_rps'])}"))
        if "tracing_added_p50_ms" in f:  # docs/tracing.md: over the same gateway with tracing off
            rows.append((f"p50 tracing adds, {clients}: endpoint unreachable / exporting",
                         f"{num(f['tracing_unreachable_added_p50_ms'], 2)} / {num(f['tracing_added_p50_ms'], 2)} ms"))
        if "ledger_added_p50_ms" in f:  # docs/spend.md: the bar is +0.5 ms p50
            rows.append((f"latency the spend ledger adds, {clients}: p50 / p99",
                         f"{num(f['ledger_added_p50_ms'], 3)} / {num(f['ledger_added_p99_ms'], 2)} ms"))
    return rows


def request_types(r: Result) -> Figures:
    return [(f"declaring a chat body ({body}): pydantic / msgspec", f"{num(r[f'pydantic_{body}_us'])} / "
             f"{num(r[f'msgspec_{body}_us'])} us") for body in ("small", "agent", "bad")]  # fmt: skip


def stream_http(r: Result) -> Figures:
    rows: Figures = []
    for level in r["levels"]:
        s = level["streams"]
        rows.append((f"streamed chat over HTTP, {s} stream{'s' * (s != 1)}: tokens/s, ITL p50 / p99",
                     f"{num(level['tok_s'], 1)}, {num(level['itl_p50_ms'], 2)} / {num(level['itl_p99_ms'], 2)} ms"))
    return rows


def _at_threshold(r: Result) -> Result:
    return min(r["sweep"], key=lambda row: abs(row["threshold"] - r["default_threshold"]))


def cache_pairs(r: Result) -> Figures:
    row = _at_threshold(r)
    return [(f"labelled pairs ({r['pairs']}) at the default threshold {r['default_threshold']}: paraphrase hits / "
             "false hits", f"{pct(row['paraphrase_hit_rate'])} / {pct(row['false_hit_rate'])}")]


def cache(r: Result) -> Figures:
    rows: Figures = []
    q = r.get("quality")
    if q:
        for mode, name in (("embedding", "embedding alone"), ("lexical", "lexical check"), ("verified", "default")):
            m = q[mode]
            rows.append((f"semantic cache, {q['pairs_file']} ({q['pairs']} pairs), {name}: paraphrases hit / hits wrong",
                         f"{pct(m['paraphrase_hit_rate'])} / {pct(m['false_hit_rate'])}"))
    for row in r.get("lookup", []):
        rows.append((f"in-process lookup at {row['entries']:,} entries: exact get / semantic match p50",
                     f"{num(row['exact_get']['p50_ms'], 3)} / {num(row['semantic_match']['p50_ms'], 3)} ms"))
    h = r.get("http") or {}
    lexical, verified = h.get("lexical"), h.get("verified")
    if lexical and lexical.get("semantic_hit"):
        rows.append(("over HTTP, p50: exact hit / semantic hit (no engine) / generating the answer (64 tokens)",
                     f"{num(lexical['exact_hit']['p50_ms'])} / {num(lexical['semantic_hit']['p50_ms'])} / "
                     f"{num(lexical['generate_same_answer']['p50_ms'])} ms"))
    for row in r.get("verify", []):
        rows.append((f"one engine verification, {row['prompt_tokens']}-token prompt + {row['answer_tokens']}-token answer:"
                     " every position scored / the answer only / generating 64 tokens",
                     f"{num(row['every_position_ms'])} / {num(row['answer_only_ms'])} / {num(row['generate_64_ms'])} ms"))
    learned = h.get("learned")
    if learned and learned.get("semantic_hit"):
        rows.append(("over HTTP, p50: semantic hit, learned matcher (`cache.semantic_match: learned`)",
                     f"{num(learned['semantic_hit']['p50_ms'])} ms"))
    if verified and verified.get("semantic_hit"):
        rows.append(("over HTTP, p50: engine-verified semantic hit / over generating the same answer (64 tokens)",
                     f"{num(verified['semantic_hit']['p50_ms'])} ms / x{verified['hit_over_generation_p50']:.2f}"))
    whole = h.get("verified_whole_answer")
    if whole and whole.get("semantic_hit"):
        rows.append((f"over HTTP, p50: engine-verified semantic hit / over generating the whole answer (p50 "
                     f"{whole['answer_tokens_p50']:.0f} tokens)",
                     f"{num(whole['semantic_hit']['p50_ms'])} ms / x{whole['hit_over_generation_p50']:.2f}"))
    return rows


def prefill(r: Result) -> Figures:
    quant = (r.get("ours") or {}).get("quantization", "?")
    peer = r.get("peer") or {}
    name = "llama.cpp's server" if peer.get("peer") == "llama-server" else str(peer.get("peer", "llama.cpp's server"))
    rows: Figures = []
    for n, row in sorted(r["lengths"].items(), key=lambda kv: int(kv[0])):
        ours = f"{num(row['ours']['ttft_p50_ms'])} ms"
        if "peer" in row:
            rows.append((f"TTFT p50, unique {n}-token prompt: engine ({quant}) / {name}",
                         f"{ours} / {num(row['peer']['ttft_p50_ms'])} ms (x{num(row['ratio_ours_over_peer'], 2)})"))
        else:
            rows.append((f"TTFT p50, unique {n}-token prompt: engine ({quant}) / llama.cpp's server",
                         f"{ours} / {HOW_TO_PEER}"))
    return rows


def prefill_attention(r: Result) -> Figures:
    rows = [(f"prompt {n} tokens ({r.get('quantization', '?')}): TTFT per-token kernel / SDPA",
             f"{num(t['per_token_ms'])} / {num(t['sdpa_ms'])} ms (x{num(t['per_token_over_sdpa'], 2)})")
            for n, t in sorted(r["ttft"].items(), key=lambda kv: int(kv[0]))]
    agrees = r.get("repeat_equal_logprobs", {})
    rows.append(("same log-probabilities again over a cached prefix (per-token / SDPA)",
                 " / ".join(num(agrees.get(m)) for m in ("per_token", "sdpa"))))
    return rows


def kv_dtype(r: Result) -> Figures:
    engines = r["engines"]
    steps = " / ".join(f"{name} {num(e['step_ms_p50'])}" for name, e in engines.items())
    return [(f"decode step p50 at batch {r['batch']} ({r.get('quantization', '?')}), by KV dtype", f"{steps} ms"),
            ("step time ratio (second / first)", f"x{num(r['step_time_ratio'], 3)}")]


def kv_window(r: Result) -> Figures:
    one, own = r["one_pool"], r["window_pool"]
    return [
        (f"context the KV budget holds, one pool / the windowed layers' own ({r['model']})",
         f"{num(one['context_tokens_budget'], 0)} / {num(own['context_tokens_budget'], 0)} tokens"),
        (f"KV held at the peak of one {num(r['prompt_tokens'], 0)}-token prompt, one pool / own pool",
         f"{num(one['kv_held_peak_mb'])} / {num(own['kv_held_peak_mb'])} MiB"),
        ("time to first token, own pool / one pool; same tokens",
         f"x{num(r['ttft_ratio'], 2)}; {'yes' if r['same_tokens'] else 'no'}"),
    ]


def cpu_kernels(r: Result) -> Figures:
    rows = [(f"decode step, torch ops / C kernels, {k.removeprefix('step_ms_b')} rows ({r.get('quantization', '?')})",
             f"x{num(v, 2)}") for k, v in r.get("speedup", {}).items()]
    rows += [(f"decode step, C layer by layer / decode stack, {k.removeprefix('step_ms_b')} rows", f"x{num(v, 2)}")
             for k, v in r.get("decode_stack_speedup", {}).items()]
    rows += [(f"decode step, AVX2 GEMMs / AVX-512 VNNI GEMMs, {k.removeprefix('step_ms_b')} rows", f"x{num(v, 2)}")
             for k, v in (r.get("isa_speedup") or {}).items()]
    ppl = {name: e["perplexity"] for name, e in r.get("engines", {}).items() if "perplexity" in e}
    if ppl:
        rows.append(("held-out perplexity (torch / C)", " / ".join(f"{k} {num(v, 2)}" for k, v in ppl.items())))
    return rows


def profile_step(r: Result) -> Figures:
    top = (r.get("top_ops") or [{}])[0]
    return [(f"decode step p50 at batch {r['batch']} ({r.get('quantization', '?')}, {r.get('threads', '?')} threads)",
             f"{num(r['step_ms_p50'])} ms ({num(r['tok_s'])} tokens/s)"),
            ("costliest op (self CPU time)", f"{top.get('op', '-')} {pct(top.get('share'))}")]


def gemm(r: Result) -> Figures:
    rows = [(f"decode step at batch {row['batch']}, F.linear / prepacked", f"x{num(row['speedup'], 2)}")
            for row in r.get("engine", [])]
    stream = (r.get("c_kernels") or {}).get("decode_stream") or {}
    for isa in (r.get("c_kernels") or {}).get("isas", []):
        rows.append((f"one token's C GEMMs at one row ({stream.get('mb', '?')} MB of weights), {isa}",
                     f"{num(stream.get(f'{isa}_ms'), 2)} ms ({num(stream.get(f'{isa}_gb_s'))} GB/s)"))
    return rows


def structured(r: Result) -> Figures:
    rows = [(f"constrained decoding overhead, {streams(n)}", f"{num(o['overhead_pct'])}% "
             f"({num(o['unconstrained_tok_s'])} -> {num(o['constrained_tok_s'])} tokens/s)")
            for n, o in sorted(r["overhead"].items(), key=lambda kv: int(kv[0]))]
    v = r.get("validity", {})
    rows.append(("constrained outputs that validate", f"{v.get('valid', '-')}/{v.get('requests', '-')}"))
    for name, c in r.get("compile", {}).items():
        rows.append((f"grammar compile, {name}: cold / cached", f"{num(c['cold_ms'])} / {num(c['cached_ms'], 3)} ms"))
    return rows


def awq(r: Result) -> Figures:
    rows = [("held-out perplexity", " / ".join(f"{k} {num(v, 2)}" for k, v in r["perplexity"].items()))]
    rows += [(f"decode, INT4 / fp32 tokens/s, {streams(n)}", f"x{num(v, 2)}") for n, v in r.get("int4_over_fp32", {}).items()]
    rows += [(f"decode, GGUF Q4_1 blocks / AWQ tokens/s, {streams(n)}", f"x{num(v, 2)}")
             for n, v in r.get("gguf_q4_1_over_awq", {}).items()]
    return rows


def quant(r: Result) -> Figures:
    rows = [("held-out perplexity", " / ".join(f"{k} {num(v, 2)}" for k, v in r["perplexity"].items()))]
    for name, by_streams in (r.get("decode_speedup_over_fp32") or {}).items():
        if isinstance(by_streams, dict):
            rows.append((f"decode speed over fp32, {name}",
                         ", ".join(f"{streams(n)} x{num(v, 2)}" for n, v in by_streams.items())))
    return rows


def speculative(r: Result) -> Figures:
    rows: Figures = []
    for case, c in r.items():
        if isinstance(c, dict) and "plain_tok_s" in c:
            methods = ", ".join(f"{m} x{num(v['speedup'], 2)}" + ("" if v.get("identical", True) else " (outputs differ)")
                                for m, v in c.items() if isinstance(v, dict))
            rows.append((f"{case.replace('_', ' ')}: speedup over plain ({num(c['plain_tok_s'])} tokens/s)", methods))
    return rows


def pipeline(r: Result) -> Figures:
    return [(f"{name.replace('_', ' ')}: tokens/s", num(r[name]["tok_s"]))
            for name in ("pp1_1thread", "pp1_2threads", "pp2_1thread_each") if name in r]


def routing(r: Result) -> Figures:
    rec = r.get("recovery", {})
    return [("tokens/s, 2 replicas / 1 replica", f"x{num(r['throughput_ratio_2_vs_1'], 2)}"),
            ("requests failed when a replica is killed", f"{rec.get('failed', '-')} of {rec.get('requests', '-')}")]


def overload(r: Result) -> Figures:
    return [("sustainable rate", f"{num(r['sustainable_rps'], 2)} requests/s"),
            ("requests lost under 2x and 4x overload (not 200, not 429)", num(r["lost_total"]))]


def soak(r: Result) -> Figures:
    return [(f"{num(r.get('duration_s'))} s of mixed traffic: requests / unexpected errors / leaked KV blocks",
             f"{num(r['requests'])} / {num(r['unexpected_errors'])} / {num(r['leaked_kv_blocks'])}")]


def kernels(r: Result) -> Figures:
    checks = r.get("checks", {})
    rows = [(f"Triton kernels correct ({'compiled' if r.get('measured') else 'interpreter'}, {r.get('device', '?')})",
             f"{sum(c.get('ok', False) for c in checks.values())}/{len(checks)}")]
    for name, m in (r.get("measured") or {}).items():
        rows.append((f"{name}: Triton / torch", f"{num(m.get('triton_us'), 2)} / {num(m.get('torch_us'), 2)} us"))
    return rows


def gguf_models(r: Result) -> Figures:
    copies, peer = r.get("copies") or {}, r.get("peer_memory") or {}
    memory = " / ".join(f"{k} {num(c.get('memory_over_file'), 2)}x" for k, c in copies.items())
    rows = [(f"resident memory after load over the file's {num(r.get('file_mb'))} MB, by copy", memory)]
    if peer:
        rows.append(("llama.cpp's server on the same file: resident memory over the file",
                     f"{num(peer.get('memory_over_file'), 2)}x"))
    rows.append(("held-out perplexity, by copy", " / ".join(f"{k} {num(c.get('perplexity'), 2)}" for k, c in copies.items())))
    if cold := r.get("cold_start"):
        rows.append(("cold start: header read / conversion and first load",
                     f"{num(cold.get('header_ms'))} ms / {num(cold.get('convert_and_load_s'))} s"))
    return rows


def gguf_layouts(r: Result) -> Figures:
    rows = [("nibbles (4-bit values) over int8, time", "x" + " to x".join(num(v, 2) for v in r["nibbles_over_int8_range"]))]
    for isa, span in (r.get("five_bits_over_int8_by_isa") or {}).items():
        rows.append((f"five bits (5-bit values, {isa}) over int8, time", "x" + " to x".join(num(v, 2) for v in span)))
    rows.append(("layouts give the same bits", "yes" if r.get("same_bits") else "no"))
    return rows


SUMMARIES: dict[str, Callable[[Result], Figures]] = {
    "throughput": throughput, "gateway_overhead": gateway_overhead, "stream_http": stream_http,
    "cache_pairs": cache_pairs, "cache": cache,
    "prefill": prefill, "prefill_attention": prefill_attention, "kv_dtype": kv_dtype, "kv_window": kv_window,
    "cpu_kernels": cpu_kernels,
    "profile_step": profile_step, "gemm": gemm, "structured": structured, "awq": awq, "quant": quant,
    "speculative": speculative, "pipeline": pipeline, "routing": routing, "overload": overload, "soak": soak,
    "kernels": kernels, "request_types": request_types, "gguf_models": gguf_models, "gguf_layouts": gguf_layouts,
}  # fmt: skip


def scalars(r: Result, limit: int = 6) -> Figures:
    """A bench this module has no summary for: its top-level numbers."""
    skip = {"provenance", "bench"}
    return [(k, num(v)) for k, v in r.items() if k not in skip and isinstance(v, int | float)][:limit]


def figures(name: str, r: Result) -> Figures:
    summary = SUMMARIES.get(str(r.get("bench") or name), scalars)
    try:
        return summary(r) or scalars(r)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return scalars(r) or [("figures", "see the JSON file")]


# ---- provenance cells --------------------------------------------------------------------------
def machine_short(prov: Result) -> str:
    m = prov.get("machine") or {}
    family = f" ({m['cpu_family']}/{m.get('cpu_model', '?')})" if m.get("cpu_family") else ""  # older results: none
    label = f"{m.get('cpu', '?')}{family}, {m.get('cores', '?')} cores"
    return f"{label}, {m['gpu']}" if m.get("gpu") else label


def run_label(prov: Result) -> str:
    """quick/full, and the load when it was above the core count (a shared machine: figures are noisy)."""
    mode = prov.get("mode", "?")
    load = max((v for v in (prov.get("load_avg_1m") or {}).values() if v is not None), default=None)
    cores = (prov.get("machine") or {}).get("cores") or 0
    return f"{mode}, loaded ({num(load)} on {cores} cores)" if load is not None and cores and load > cores else mode


def day(prov: Result) -> str:
    return str(prov.get("date", "?"))[:10]


# ---- the tables --------------------------------------------------------------------------------
def load_results(results: Path) -> dict[str, Result]:
    out: dict[str, Result] = {}
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict):
            out[path.stem] = data
    return out


def _order(names: Iterator[str] | list[str]) -> list[str]:
    from bench.registry import BY_NAME

    known = list(BY_NAME)
    return sorted(names, key=lambda n: (known.index(n) if n in known else len(known), n))


def link(name: str, base: Path, results: Path) -> str:
    target = os.path.relpath(results / f"{name}.json", base)
    return f"[{name}.json]({Path(target).as_posix()})"


def full_table(results: dict[str, Result], base: Path, results_dir: Path) -> list[str]:
    lines = ["| bench | figure | value | run | machine | commit | date | source |", "|---|---|---|---|---|---|---|---|"]
    for name in _order([n for n in results if n != "suite"]):
        r = results[name]
        prov = r.get("provenance") or {}
        cite = (f"{run_label(prov)} | {machine_short(prov)} | {commit_label(prov)} | {day(prov)} | "
                f"{link(name, base, results_dir)}") if prov else f"- | no provenance | - | - | {link(name, base, results_dir)}"
        for what, value in figures(name, r):
            lines.append(f"| `{name}` | {cell(what)} | {cell(value)} | {cite} |")
    return lines


def caveats(results: dict[str, Result]) -> list[str]:
    """Say it when figures come from smoke runs or a shared machine: they show that the benches run, no more."""
    provs = [r.get("provenance") or {} for n, r in results.items() if n != "suite"]
    quick = sum(p.get("mode") == "quick" for p in provs)
    loaded = sum("loaded" in run_label(p) for p in provs if p)
    dirty = sum(bool((p.get("commit") or {}).get("dirty")) for p in provs)
    notes = []
    if quick:
        notes.append(f"{quick} of these {len(provs)} results come from quick (smoke) runs: tiny workloads, not comparable "
                     "to full runs")
    if loaded:
        notes.append(f"{loaded} were measured while the machine was shared (load above its core count): their timings "
                     "are far below what it does idle; the ratios measured side by side hold better")
    if dirty:
        notes.append(f"{dirty} ran on a tree with uncommitted changes (`-dirty`; the JSON lists the files)")
    return ["", "Note: " + "; ".join(notes) + ". Run `make bench` on an idle machine for figures to quote."] if notes else []


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def machines(results: dict[str, Result]) -> list[str]:
    """Every machine the results came from, in full (the table shows a short label)."""
    seen: dict[str, Result] = {}
    for r in results.values():
        prov = r.get("provenance") or {}
        if prov:
            seen.setdefault(machine_short(prov), prov)
    lines = []
    for label, prov in seen.items():
        m, v = prov.get("machine") or {}, prov.get("versions") or {}
        lines.append(
            f"- **{label}**: {m.get('cores_usable', '?')} usable cores, {num(m.get('memory_gib'))} GiB, CPU flags "
            f"{' '.join(m.get('cpu_flags') or []) or 'none of note'}{', virtual machine' if m.get('hypervisor') else ''}"
            f"{f', C GEMMs on {isa}' if (isa := m.get('kernel_isa')) else ''}; "
            f"{m.get('os', '?')}; Python {v.get('python', '?')}, torch {v.get('torch', '?')}, "
            f"transformers {v.get('transformers', '-')}."
        )
    return lines


def not_measured(results: dict[str, Result]) -> list[str]:
    """The suite's benches without a result file, and those the last suite run could not finish."""
    from bench.registry import SUITE

    runs = {r["name"]: r for r in (results.get("suite") or {}).get("runs", [])}
    lines = []
    for b in SUITE:
        run = runs.get(b.name)
        if run and run.get("status") != "ok":
            kept = " (the table shows an earlier result)" if b.name in results else ""
            lines.append(f"- `{b.name}`: {run['status']} after {num(run.get('seconds'))} s in the {run.get('mode', '?')} "
                         f"run of {str(run.get('date', '?'))[:10]}{kept}.")
        elif b.name not in results:
            lines.append(f"- `{b.name}`: not measured yet (`python -m bench.{b.name}` or `make bench`).")
    return lines


PLOT_SOURCES = {  # bench/plots.py's PNGs and the result file each is drawn from
    "throughput": "throughput", "throughput_latency": "throughput", "cache_pairs": "cache_pairs", "awq": "awq",
    "overload": "overload", "soak": "soak",
}  # fmt: skip


def plot_lines(results: dict[str, Result], base: Path, plots: Path, results_dir: Path) -> list[str]:
    lines = []
    for png, source in PLOT_SOURCES.items():
        if source in results and (plots / f"{png}.png").exists():
            prov = results[source].get("provenance") or {}
            target = Path(os.path.relpath(plots / f"{png}.png", base)).as_posix()
            lines += [f"![{png}]({target})", "",
                      f"*{png}.png: from {link(source, base, results_dir)}, {machine_short(prov)}, commit "
                      f"{commit_label(prov)}, {day(prov)}.*", ""]
    return lines


def docs_block(results: dict[str, Result], base: Path, results_dir: Path, plots: Path) -> str:
    lines = ["<!-- generated by `python -m bench.tables` from bench/results/*.json: edit those, not this -->", ""]
    if any(n != "suite" for n in results):
        lines += full_table(results, base, results_dir)
        lines += caveats(results)
    else:
        lines.append("No results yet: run `make bench` (or `make bench BENCH_QUICK=1` for a smoke run).")
    lines += ["", "Machines:", "", *(machines(results) or ["- none yet"])]
    missing = not_measured(results)
    if missing:
        lines += ["", "Not in the table:", "", *missing]
    pics = plot_lines(results, base, plots, results_dir)
    if pics:
        lines += ["", "Plots (`python -m bench.plots`):", "", *pics]
    return "\n".join(lines).rstrip() + "\n"


def readme_rows(results: dict[str, Result]) -> list[tuple[str, str, str]]:
    """(figure, value, source) for the few figures a user asks about first."""
    rows: list[tuple[str, str, str]] = []
    r = results.get("throughput")
    if r:
        for what, value in throughput(r):
            if "TTFT" in what and not what.startswith(f"engine ({r.get('engine_quantization', '?')}), 1 stream"):
                continue
            rows.append((what, value, "throughput"))
    else:
        rows.append(("engine tokens/s, HF `generate`, llama.cpp's server", "not measured yet", "throughput"))
    picks = {
        "gateway_overhead": lambda what: "1 client" in what and "latency" in what,
        "cache": lambda what: what.startswith("over HTTP") or (what.startswith("semantic cache") and "default" in what),
        "cache_pairs": lambda what: True,
        "prefill": lambda what: "2000-token" in what,
        "structured": lambda what: what.startswith("constrained decoding overhead, 1 stream"),
        "awq": lambda what: what.startswith("held-out"),
    }
    for name, keep in picks.items():
        if name in results:
            rows += [(what, value, name) for what, value in figures(name, results[name]) if keep(what)]
    return rows


def readme_block(results: dict[str, Result], base: Path, results_dir: Path) -> str:
    lines = ["<!-- generated by `python -m bench.tables` from bench/results/*.json: edit those, not this -->", "",
             "| figure | value | run | machine | commit | source |", "|---|---|---|---|---|---|"]
    for what, value, name in readme_rows(results):
        prov = (results.get(name) or {}).get("provenance") or {}
        src = link(name, base, results_dir) if name in results else "-"
        lines.append(f"| {cell(what)} | {cell(value)} | {run_label(prov) if prov else '-'} | "
                     f"{machine_short(prov) if prov else '-'} | {commit_label(prov) if prov else '-'} | {src} |")
    lines += ["", "All figures, how each was measured, and the plots: [docs/benchmarks.md](docs/benchmarks.md)."]
    return "\n".join(lines) + "\n"


def replace_between(text: str, mark: str, body: str) -> str | None:
    """`text` with everything between the mark's start and end comments replaced by `body`; None without markers."""
    start, end = f"<!-- {mark}:start -->", f"<!-- {mark}:end -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        return None
    return text[: i + len(start)] + "\n" + body + text[j:]


def rewrite(path: Path, mark: str, body: str) -> bool:
    """Replace the marked block in `path`; True when the file changed."""
    if not path.exists():
        print(f"tables: {path} is missing; skipped", flush=True)
        return False
    old = path.read_text()
    new = replace_between(old, mark, body)
    if new is None:
        print(f"tables: {path} has no <!-- {mark}:start --> ... <!-- {mark}:end --> markers; skipped", flush=True)
        return False
    if new != old:
        path.write_text(new)
    return new != old


def regenerate(results_dir: Path = RESULTS, docs: Path = DOCS, readme: Path = README, plots: Path = PLOTS) -> list[Path]:
    """Both tables from `results_dir`; the files that changed."""
    results = load_results(results_dir)
    written = []
    if rewrite(docs, DOCS_MARK, docs_block(results, docs.parent, results_dir, plots)):
        written.append(docs)
    if rewrite(readme, README_MARK, readme_block(results, readme.parent, results_dir)):
        written.append(readme)
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    p = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--docs", type=Path, default=DOCS)
    p.add_argument("--readme", type=Path, default=README)
    p.add_argument("--plots", type=Path, default=PLOTS, help="where bench/plots.py wrote the PNGs")
    args = p.parse_args(argv)
    written = regenerate(args.results, args.docs, args.readme, args.plots)
    print(json.dumps([str(p) for p in written]))
    return written


if __name__ == "__main__":
    main()
