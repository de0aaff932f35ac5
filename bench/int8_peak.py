"""The int8 multiply-add rate of this CPU with the GEMMs' own instructions, and the LM head's time against it.

    python -m bench.int8_peak                 # the rate on each instruction set this CPU runs, all usable cores
    python -m bench.int8_peak --isa avx2      # one of them

A roof for the C GEMMs, measured here rather than read off a data sheet: `bench/kernels/int8_peak.c` runs the AVX2
tiles' inner step (|w| times sign(x, w) on vpmaddubsw, vpmaddwd, an int32 add: four instructions for 32
multiply-adds) and `bench/kernels/int8_peak_avx512.c` the AVX-512 tile's (vpdpbusd on 512-bit vectors: one
instruction for 64), from L1, on as many OpenMP threads as the engine uses. `bench.profile_step` reads it for the LM
head: an int8 GEMM of rows x vocabulary x hidden multiply-adds can take no less than that count over this rate, and
a large vocabulary (Gemma 3's 262,144) makes that floor most of a 32-row decode step, whatever the kernel.
Last line: one JSON object (also bench/results/int8_peak.json).
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path
from typing import Any

import torch

from backend.config import cache_dir
from bench.report import emit
from kernels.cpu.build import avx512_available, c_kernels_unavailable, load_c_kernel

DEFAULT_OUT = Path(__file__).parent / "results" / "int8_peak.json"
SOURCES = {"avx2": ("int8_peak.c", "int8_peak_avx2"), "avx512": ("int8_peak_avx512.c", "int8_peak_vnni512")}
MAX_THREADS = 256


def isas() -> list[str]:
    """The instruction sets whose GEMMs can run here (x86 with the C kernels)."""
    if c_kernels_unavailable() is not None:
        return []
    return ["avx2", "avx512"] if avx512_available() else ["avx2"]


def peak_gmac_s(isa: str, threads: int = 0, seconds: float = 0.3, reps: int = 3) -> float:
    """The best of `reps` runs of about `seconds` each: billions of int8 multiply-adds a second, all threads."""
    if isa not in isas():
        raise ValueError(f"{isa!r} does not run here; this CPU runs {isas()}")
    source, symbol = SOURCES[isa]
    lib = load_c_kernel(Path(__file__).parent / "kernels" / source, cache_dir() / "kernels")
    if lib is None:
        raise RuntimeError(f"bench/kernels/{source} did not build (its log is in {cache_dir() / 'kernels'})")
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int32)]
    threads = threads or torch.get_num_threads()
    sink = (ctypes.c_int32 * MAX_THREADS)()
    passes = 1 << 16
    while True:  # passes for `seconds` a run, from a short one
        start = time.perf_counter()
        fn(passes, threads, sink)
        took = time.perf_counter() - start
        if took > seconds / 8:
            passes = max(1, int(passes * seconds / took))
            break
        passes *= 4
    return max(fn(passes, threads, sink) for _ in range(reps)) / 1e9


def head_floor(gmac: float, peak: float, measured_ms: float) -> dict[str, float]:
    """An int8 GEMM of `gmac` billion multiply-adds against the rate `peak`: its floor and the measured time's share
    of it (1.0: at the roof)."""
    floor_ms = gmac / peak * 1e3
    return {"gmac": round(gmac, 3), "floor_ms": round(floor_ms, 2), "measured_ms": round(measured_ms, 2),
            "share_of_peak": round(floor_ms / measured_ms, 3)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.int8_peak", description=__doc__.split("\n\n")[0])
    p.add_argument("--isa", choices=sorted(SOURCES), default=None, help="one instruction set (default: each here)")
    p.add_argument("--threads", type=int, default=0, help="0: torch's threads (the engine's)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    threads = args.threads or torch.get_num_threads()
    here = isas()
    if not here:
        result: dict[str, Any] = {"bench": "int8_peak", "status": "absent", "why": c_kernels_unavailable()}
        return emit(result, args.out)
    rates = {}
    for isa in [args.isa] if args.isa else here:
        rates[isa] = {"threads": threads, "gmac_s": round(peak_gmac_s(isa, threads), 1),
                      "gmac_s_one_thread": round(peak_gmac_s(isa, 1), 1)}
        print(f"{isa:7s} {rates[isa]['gmac_s']:8.1f} G int8 multiply-adds/s on {threads} threads, "
              f"{rates[isa]['gmac_s_one_thread']:.1f} on one", flush=True)
    return emit({"bench": "int8_peak", "isas": rates}, args.out)


if __name__ == "__main__":
    main()
