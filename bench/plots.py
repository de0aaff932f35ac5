"""PNG plots of the benchmark results: every bench/results/NAME.json this knows gets a NAME.png beside it.

    python -m bench.plots [--results bench/results] [--out bench/plots]

throughput*.json (bench.throughput): aggregate tokens/s by concurrent streams for each run, the HF
`generate` baseline and llama.cpp's server when measured in the same run, plus TTFT and inter-token latency percentiles;
cache_pairs.json: paraphrase hit rate and false-hit share by similarity threshold; awq.json: perplexity
and decode speed, INT4 vs fp32; overload.json: offered, answered and rejected rates and latency per
phase; soak.json: the server's RSS over the run. Each PNG carries a footnote citing its JSON file, the
machine, the commit and the date (the result's provenance). The PNGs go to bench/plots/ (the copy that
docs/benchmarks.md shows; --out writes them elsewhere). The last line printed is a JSON list of the files
written.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
PLOTS = Path(__file__).parent / "plots"
Figure = Any  # matplotlib.figure.Figure (matplotlib is imported lazily: an optional `bench` extra)


def _figure(ncols: int = 1, width: float = 6.0) -> tuple[Figure, Any]:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, 4.0), squeeze=False)
    return fig, axes[0]


def _levels(run: dict[str, Any]) -> list[int]:
    return sorted(int(k.split("_")[1]) for k in run if k.startswith("engine_") and k.split("_")[1].isdigit())


def _label(run: dict[str, Any]) -> str:
    return f"engine ({run.get('engine_quantization', '?')}, {run.get('threads', '?')} threads)"


def throughput(runs: dict[str, dict[str, Any]]) -> Figure:
    fig, (ax,) = _figure()
    for run in runs.values():
        levels = _levels(run)
        ax.plot(levels, [run[f"engine_{s}"]["tok_s"] for s in levels], "o-", label=_label(run))
    first = next(iter(runs.values()))
    if "hf_sequential" in first:
        ax.plot([1], [first["hf_sequential"]["tok_s"]], "s", color="black", label="HF generate (one at a time)")
    peer = sorted(int(k.split("_")[1]) for k in first if k.startswith("peer_") and k.split("_")[1].isdigit())
    if peer:  # measured in the same run (bench/peer.py); never a typed-in figure
        name = first.get("peer", {}).get("peer", "peer")
        ax.plot(peer, [first[f"peer_{s}"]["tok_s"] for s in peer], "^--", color="grey", label=f"{name} (same run)")
    else:  # said on the plot, never drawn from a typed-in figure
        ax.plot([], [], " ", label="llama.cpp's server: absent (not run)")
    if "hf_sequential" not in first:
        ax.plot([], [], " ", label="HF generate: absent")
    ax.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="aggregate tokens/s")
    ax.set_title(f"Throughput, {first.get('new_tokens', '?')} new tokens per request ({first.get('device', '?')})")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def latency(run: dict[str, Any]) -> Figure:
    fig, axes = _figure(ncols=2, width=4.5)
    levels = _levels(run)
    for ax, metric, title in ((axes[0], "ttft", "time to first token"), (axes[1], "itl", "inter-token latency")):
        x = range(len(levels))
        for offset, pct, color in ((-0.2, "p50", "tab:blue"), (0.2, "p99", "tab:orange")):
            values = [run[f"engine_{s}"][f"{metric}_{pct}_ms"] for s in levels]
            ax.bar([i + offset for i in x], values, width=0.4, label=pct, color=color)
        ax.set_xticks(list(x), [f"{s} stream{'s' * (s > 1)}" for s in levels])
        ax.set(ylabel="ms", title=f"{title}, {_label(run)}")
        ax.legend(fontsize=8)
    return fig


def cache_pairs(result: dict[str, Any]) -> Figure:
    fig, (ax,) = _figure()
    rows = result["sweep"]
    x = [r["threshold"] for r in rows]
    ax.plot(x, [100 * r["paraphrase_hit_rate"] for r in rows], "o-", label="paraphrases answered from the cache")
    ax.plot(x, [100 * r["false_hit_rate"] for r in rows], "s-", color="tab:red", label="false hits (share of all hits)")
    ax.axvline(result["default_threshold"], color="grey", linestyle="--", label=f"default {result['default_threshold']}")
    ax.set(xlabel="cosine similarity threshold", ylabel="%", ylim=(0, 100))
    ax.set_title(f"Semantic cache on {result['pairs']} labelled pairs (all-MiniLM-L6-v2 + key-term guards)", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def awq(result: dict[str, Any]) -> Figure:
    fig, axes = _figure(ncols=2, width=4.5)
    ppl = result["perplexity"]
    axes[0].bar(list(ppl), list(ppl.values()), color=["tab:blue", "tab:grey", "tab:green"][: len(ppl)])
    axes[0].set(ylabel="perplexity (held-out text)", title="quality: fp32 vs INT4 (RTN, AWQ)")
    speeds = result["decode_tok_s"]
    levels = sorted({int(s) for v in speeds.values() for s in v})
    for offset, name in ((-0.2, "fp32"), (0.2, "int4")):
        axes[1].bar([i + offset for i in range(len(levels))], [speeds[name][str(s)] for s in levels], width=0.4, label=name)
    axes[1].set_xticks(range(len(levels)), [f"{s} stream{'s' * (s > 1)}" for s in levels])
    axes[1].set(ylabel="decode tokens/s", title=f"speed ({result.get('cpus', '?')} CPU threads)")
    axes[1].legend(fontsize=8)
    return fig


def overload(result: dict[str, Any]) -> Figure:
    fig, axes = _figure(ncols=2, width=4.5)
    phases = result["phases"]
    names = [p["phase"] for p in phases]
    x = range(len(phases))
    offered = [p["offered_rps"] or p["answered_rps"] for p in phases]
    phase_s = result["phase_s"]
    axes[0].bar([i - 0.27 for i in x], offered, width=0.27, label="offered", color="tab:grey")
    axes[0].bar(list(x), [p["answered_rps"] for p in phases], width=0.27, label="answered (200)", color="tab:green")
    axes[0].bar([i + 0.27 for i in x], [p["rejected_429"] / phase_s for p in phases], width=0.27, label="429", color="tab:red")
    axes[0].set_xticks(list(x), names)
    axes[0].set(ylabel="requests/s", title=f"sustainable {result['sustainable_rps']} req/s; lost: {result['lost_total']}")
    axes[0].legend(fontsize=8)
    for pct, marker in (("p50", "o-"), ("p99", "s-"), ("max", "^:")):
        axes[1].plot(list(x), [p[f"latency_{pct}_s"] for p in phases], marker, label=pct)
    axes[1].set_xticks(list(x), names)
    axes[1].set(ylabel="latency of answered requests (s)", title="latency stays bounded", ylim=(0, None))
    axes[1].legend(fontsize=8)
    return fig


def soak(result: dict[str, Any]) -> Figure:
    fig, (ax,) = _figure()
    samples = result["rss_samples_mb"]
    ax.plot([t / 60 for t, _ in samples], [mb for _, mb in samples])
    ax.set(xlabel="minutes", ylabel="server RSS (MiB)", ylim=(0, max(mb for _, mb in samples) * 1.2))
    ax.set_title(
        f"soak: {result['requests']} requests, {result['unexpected_errors']} unexpected errors, "
        f"{result['leaked_kv_blocks']} leaked KV blocks",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    return fig


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def footnote(fig: Figure, source: Path) -> None:
    """Cite the result file, machine, commit and date under the plot (when the result has its provenance)."""
    from bench.provenance import commit_label

    prov = _load(source).get("provenance")
    if not prov:
        return
    m = prov.get("machine") or {}
    text = (f"bench/results/{source.name} · {m.get('cpu', '?')}, {m.get('cores', '?')} cores"
            f"{', ' + m['gpu'] if m.get('gpu') else ''} · commit {commit_label(prov)} · {prov.get('date', '?')[:10]}"
            f"{' · quick run' if prov.get('mode') == 'quick' else ''}")
    fig.text(0.005, 0.005, text, fontsize=6, color="grey", ha="left", va="bottom")


def plot_all(results: Path, out: Path) -> list[Path]:
    jobs: list[tuple[str, Callable[[], Figure], Path]] = []
    runs: dict[str, dict[str, Any]] = {}
    for path in sorted(results.glob("throughput*.json")):
        run = _load(path)
        if run not in runs.values():  # throughput.json is also saved under a run's own name
            runs[path.stem] = run
    if runs:
        default = results / "throughput.json"  # the latest default run (also saved under its own name)
        source = default if default.exists() else results / f"{next(iter(runs))}.json"
        main_run = _load(source)
        jobs.append(("throughput", lambda: throughput(runs), source))
        jobs.append(("throughput_latency", lambda: latency(main_run), source))
    plotters: dict[str, Callable[[dict[str, Any]], Figure]] = {
        "cache_pairs": cache_pairs, "awq": awq, "overload": overload, "soak": soak,
    }  # fmt: skip
    for name, plotter in plotters.items():
        path = results / f"{name}.json"
        if path.exists():
            jobs.append((name, lambda plotter=plotter, path=path: plotter(_load(path)), path))  # type: ignore[misc]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make, source in jobs:
        fig = make()
        fig.tight_layout(rect=(0, 0.03, 1, 1))  # room for the footnote
        footnote(fig, source)
        target = out / f"{name}.png"
        fig.savefig(target, dpi=100)
        written.append(target)
        import matplotlib.pyplot as plt

        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=PLOTS, help="where the PNGs go (default: bench/plots)")
    args = parser.parse_args(argv)
    written = plot_all(args.results, args.out)
    print(json.dumps([str(p) for p in written]))


if __name__ == "__main__":
    main()
