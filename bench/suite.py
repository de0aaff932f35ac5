"""The benchmark suite: run the chosen benches, then regenerate the docs' tables and the plots from their results.

    python -m bench.suite                         # every bench below with its default arguments (an hour or more)
    python -m bench.suite --quick                 # a smoke run: each bench on a tiny workload (also BENCH_QUICK=1)
    python -m bench.suite --only throughput,cache --llama-server /path/to/llama-server
    python -m bench.suite --list                  # the suite: names, arguments, quick arguments

`make bench` runs it (`make bench BENCH_QUICK=1 LLAMA_SERVER=/path/to/llama-server PEER_URL=... BENCH_ONLY=...`).
Each bench runs as its own process (`python -m bench.NAME ARGS`: a fresh interpreter, so one bench's threads and
caches never reach the next) and writes bench/results/NAME.json with its provenance (bench/report.py). A bench that
fails or runs past its time limit is recorded as such and the suite goes on; its previous result file, if any,
stays (the tables cite each file's own date and commit). Peers: --llama-server PATH or --peer-url URL go to
bench.throughput and bench.prefill, which measure llama.cpp's server in the same run; without either the peer is
reported absent.
HF `generate` is measured by bench.throughput whenever transformers is installed. At the end the suite writes
bench/results/suite.json (what ran, how it ended, how long it took), then `python -m bench.tables` (the tables in
docs/benchmarks.md and README.md) and `python -m bench.plots --out bench/plots` (the PNGs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.registry import BY_NAME, SUITE, Bench
from bench.report import RESULTS, emit

REPO = Path(__file__).resolve().parent.parent
PLOTS = Path(__file__).resolve().parent / "plots"
QUICK_TIMEOUT_S = 900.0


def peer_args(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    for flag, value in (("--llama-server", args.llama_server), ("--peer-url", args.peer_url),
                        ("--peer-gguf", args.peer_gguf), ("--peer-api-key", args.peer_api_key)):  # fmt: skip
        if value:
            out += [flag, str(value)]
    return out


def run_one(
    bench: Bench, quick: bool, extra: list[str], timeout_s: float | None, *, quantization: str = ""
) -> dict[str, Any]:
    """One bench in its own process; how it ended and whether it wrote its result file."""
    argv = bench.argv(quick) + (extra if bench.peer else [])
    if quantization and bench.quantization:
        argv += ["--quantization", quantization]
    out = RESULTS / f"{bench.name}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    if quick:
        env["BENCH_QUICK"] = "1"
    if quantization:  # the benches that start a gateway or read the serving configuration
        env["SMOLGATE_QUANTIZATION"] = quantization
    print(f"\n=== bench.{bench.name}: {' '.join(argv[1:])}", flush=True)
    start = time.monotonic()
    before = out.stat().st_mtime if out.exists() else None
    try:
        rc: int | None = subprocess.run(argv, cwd=REPO, env=env, timeout=timeout_s).returncode
        status = "ok" if rc == 0 else "failed"
    except subprocess.TimeoutExpired:
        rc, status = None, "timeout"
    wrote = out.exists() and out.stat().st_mtime != before
    if status == "ok" and not wrote:
        status = "no result"
    seconds = round(time.monotonic() - start, 1)
    print(f"=== bench.{bench.name}: {status} in {seconds} s", flush=True)
    return {"name": bench.name, "command": " ".join(["python", *argv[1:]]), "status": status, "returncode": rc,
            "seconds": seconds, "result": f"bench/results/{bench.name}.json" if wrote else None,
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "mode": "quick" if quick else "full"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from bench import peer

    p = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", default=bool(os.environ.get("BENCH_QUICK")),
                   help="smoke run: tiny workloads (default when BENCH_QUICK is set)")
    p.add_argument("--only", default="", help="comma-separated bench names (default: the whole suite)")
    p.add_argument("--skip", default="", help="comma-separated bench names to leave out")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"seconds per bench (default: none; {QUICK_TIMEOUT_S:.0f} with --quick)")
    p.add_argument("--quantization", choices=["auto", "awq", "none"], default=os.environ.get("BENCH_QUANTIZATION") or None,
                   help="the engine's weights in every bench that has the choice (default: each bench's own, "
                   "mostly the INT4 copy that `python -m backend.fetch` writes: the GGUF's blocks)")
    p.add_argument("--no-tables", action="store_true", help="do not regenerate the tables and plots at the end")
    p.add_argument("--list", action="store_true", help="print the suite and exit")
    peer.add_peer_args(p)
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or [b.name for b in SUITE]
    unknown = [n for n in [*names, *args.skip.split(",")] if n and n not in BY_NAME]
    if unknown:
        p.error(f"unknown bench {', '.join(unknown)}; the suite: {', '.join(BY_NAME)}")
    args.benches = [BY_NAME[n] for n in names if n not in args.skip.split(",")]
    if args.timeout is None and args.quick:
        args.timeout = QUICK_TIMEOUT_S
    return args


def regenerate() -> None:
    """The tables (docs/benchmarks.md, README.md) and the PNG plots, from bench/results/*.json."""
    from bench import plots, tables

    try:  # first: the tables show the plots that exist
        for path in plots.plot_all(RESULTS, PLOTS):
            print(f"plot: {path.relative_to(REPO)}", flush=True)
    except ImportError as exc:  # matplotlib is an optional extra
        print(f"plots skipped: {exc} (pip install -e '.[bench]')", flush=True)
    for path in tables.regenerate(RESULTS):
        print(f"tables: {path.relative_to(REPO)}", flush=True)


def merged(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This run's entries over the previous suite.json's (a partial run keeps what the others last did), suite order."""
    previous: dict[str, dict[str, Any]] = {}
    path = RESULTS / "suite.json"
    if path.exists():
        try:
            previous = {r["name"]: r for r in json.loads(path.read_text()).get("runs", [])}
        except (ValueError, KeyError, TypeError):
            previous = {}
    latest = {**previous, **{r["name"]: r for r in runs}}
    return sorted(latest.values(), key=lambda r: list(BY_NAME).index(r["name"]) if r["name"] in BY_NAME else len(BY_NAME))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.list:
        for b in SUITE:
            print(f"{b.name:<17} {b.what}\n{'':17} full:  {' '.join(b.args) or '(defaults)'}\n"
                  f"{'':17} quick: {' '.join(b.quick) or '(defaults)'}")
        return {}
    extra = peer_args(args)
    runs = [run_one(b, args.quick, extra, args.timeout, quantization=args.quantization or "") for b in args.benches]
    result = {
        "bench": "suite", "mode": "quick" if args.quick else "full", "timeout_s": args.timeout,
        "this_run": [r["name"] for r in runs], "runs": merged(runs),
        "peer": "llama-server" if args.llama_server else "url" if args.peer_url else "absent",
    }  # fmt: skip
    out = emit(result, RESULTS / "suite.json", echo=False)
    if not args.no_tables:
        regenerate()
    failed = [r["name"] for r in runs if r["status"] != "ok"]
    if failed:
        print(f"not measured in this run: {', '.join(failed)} (see bench/results/suite.json)", flush=True)
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
