"""A bench's figures: saved under bench/results/ (or --out) with their provenance, and printed as the last line.

Every bench ends with `emit(result, out)`: the result gets a `provenance` object (bench/provenance.py: machine,
commit, date, command, versions, load) and is written to `out` (bench/results/NAME.json by default), then
printed as one JSON line, the same object. bench/tables.py and bench/plots.py read those files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.provenance import machine_label, provenance

RESULTS = Path(__file__).resolve().parent / "results"


def default_out(name: str) -> Path:
    return RESULTS / f"{name}.json"


def emit(result: dict[str, Any], out: Path | None = None, *, echo: bool = True) -> dict[str, Any]:
    """Add provenance, write `out` (default: bench/results/<result['bench']>.json), print the machine (its CPU's
    instruction sets and the C GEMMs' choice, next to the figures above) and the same object (unless `echo` is false:
    the caller prints it last itself)."""
    result = {**result, "provenance": provenance()}
    print(f"machine: {machine_label(result['provenance'])}", flush=True)
    out = out or default_out(str(result.get("bench", "bench")))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if echo:
        print(json.dumps(result), flush=True)
    return result
