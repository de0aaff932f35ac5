"""`python -m gateway.usage`: the ledger's spend as CSV, one line per UTC day, key and model.

    python -m gateway.usage [--config gateway.yaml] [--days 30 | --start 2026-11-01 [--end 2026-12-01]]

Reads the ledger the configuration names (`ledger.url`, else the SQLite file in `ledger.dir`) without a running
gateway: rows a running gateway answered in the last moments may still be on their way from its journal.
"""

from __future__ import annotations

import argparse
import calendar
import csv
import sys
import time
from collections import defaultdict
from typing import TextIO

from gateway.config import load_config
from gateway.spend.stores import open_store

HEADER = ("date", "key", "model", "requests", "input_tokens", "cached_tokens", "output_tokens", "cost", "currency")


def _day(text: str) -> float:
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d")))


def export(argv: list[str] | None = None, out: TextIO = sys.stdout) -> None:
    parser = argparse.ArgumentParser(prog="python -m gateway.usage", description=__doc__.split("\n")[0])
    parser.add_argument("--config", help="the gateway's YAML configuration (default: $SMOLGATE_CONFIG)")
    parser.add_argument("--days", type=int, default=30, help="the last N days, today included (default 30)")
    parser.add_argument("--start", help="first UTC day, YYYY-MM-DD (instead of --days)")
    parser.add_argument("--end", help="the UTC day after the last, YYYY-MM-DD (default: tomorrow)")
    args = parser.parse_args(argv)
    now = time.time()
    today = now - now % 86400
    end = _day(args.end) if args.end else today + 86400
    start = _day(args.start) if args.start else today - (args.days - 1) * 86400
    cfg = load_config(args.config)
    ledger = cfg.spend.ledger
    store = open_store(ledger.url, ledger.sqlite_path)
    try:
        aggregates = store.aggregate(start, end, 86400)
    finally:
        store.close()
    sums: dict[tuple[int, str, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0, 0.0])
    for a in aggregates:
        s = sums[(a.bucket, a.key_name, a.model)]
        for i, v in enumerate((a.requests, a.input_tokens, a.cached_tokens, a.output_tokens, a.cost)):
            s[i] += v
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for (bucket, key, model), (n, inp, cached, output, cost) in sorted(sums.items()):
        day = time.strftime("%Y-%m-%d", time.gmtime(start + bucket * 86400))
        writer.writerow((day, key, model, int(n), int(inp), int(cached), int(output), f"{cost:.9g}", cfg.spend.currency))


if __name__ == "__main__":
    export()
