"""Where a figure came from: the machine, the commit, the date, the command and the versions of a bench run.

bench/report.py's `emit` adds `provenance()` to every result it writes, so each bench/results/NAME.json says
what produced it, and bench/tables.py cites it beside every figure. Importing this module marks the start of
the run (benches import bench.report at the top), so `duration_s` and the load average at start cover the
whole run: the load says whether the machine was shared while it ran.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
STARTED = dt.datetime.now(dt.UTC)
_STARTED_MONOTONIC = time.monotonic()
_LOAD_AT_START = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

# The CPU features the kernels choose between (backend/quant/cpu_gemm.py, kernels/cpu/*.c): AVX2/FMA for the C kernels,
# AVX-512 F/BW/VL + VNNI for their GEMMs' *_avx512.c variants (machine()'s kernel_isa says which ran), AVX-512 VNNI /
# BF16 and AMX for oneDNN's int8 and bf16 paths.
CPU_FLAGS = (
    "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
    "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip
# What `make bench` itself rewrites: a second run on a committed tree must not read as a dirty one.
GENERATED = ("bench/results/", "bench/plots/")
VERSIONED = ("torch", "transformers", "numpy", "llguidance", "sentence-transformers", "smolgate")
SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (Linux); empty elsewhere."""
    fields: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def _memory_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _gpu() -> str | None:
    """The CUDA device's name when torch is already loaded and sees one (never imports torch: torch-free benches)."""
    torch = sys.modules.get("torch")
    with contextlib.suppress(Exception):
        if torch is not None and torch.cuda.is_available():
            return str(torch.cuda.get_device_name())
    return None


def kernel_isa() -> str | None:
    """The instruction set of the C GEMMs this process loads ("avx512", "avx2" or "neon-dotprod", SMOLGATE_CPU_ISA
    applied); None where they cannot run (kernels/cpu/build.py; it imports no torch until it builds)."""
    from kernels.cpu.build import c_gemms_unavailable, cpu_isa

    with contextlib.suppress(ValueError):
        return cpu_isa() if c_gemms_unavailable() is None else None
    return None


def machine() -> dict[str, Any]:
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        # a hypervisor may name every AMD server CPU "AMD EPYC": the family and model tell Zen 1 (23/1) from Zen 4
        # (25/17) and Zen 5 (26/2), whose kernels' speeds differ
        "cpu_family": info.get("cpu family"),
        "cpu_model": info.get("model"),
        "cores": os.cpu_count(),
        "cores_usable": affinity,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "kernel_isa": kernel_isa(),
        "memory_gib": _memory_gib(),
        "gpu": _gpu(),
        "hypervisor": "hypervisor" in flags,
        "os": f"{platform.system()} {platform.release()}",
        "hostname": platform.node(),
    }


def _git(*args: str) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            return out.stdout
    return None


def commit() -> dict[str, Any]:
    """HEAD and whether the tracked code differs from it (generated results, plots and prose do not count)."""
    stated = os.environ.get("SMOLGATE_BENCH_COMMIT")
    if stated:  # a copy of the tree on another machine (a GPU's), whose .git may be absent or older: as launched
        return {"sha": stated, "dirty": None, "dirty_files": [], "source": "SMOLGATE_BENCH_COMMIT"}
    head = _git("rev-parse", "HEAD")
    if head is None:
        return {"sha": "unknown", "dirty": None, "dirty_files": []}
    status = _git("status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if len(line) > 3]
    dirty = [p for p in changed if not p.startswith(GENERATED) and not p.endswith(".md")]
    return {
        "sha": head.strip(),
        "branch": (_git("rev-parse", "--abbrev-ref", "HEAD") or "").strip() or None,
        "dirty": bool(dirty),
        "dirty_files": dirty[:20],
    }


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[name] = importlib.metadata.version(name)
    return out


def command() -> str:
    """The command line that ran this process, as a shell would take it (`python -m bench.NAME ...`)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    argv[0] = "python"
    return shlex.join(argv)


def settings() -> dict[str, str]:
    """SMOLGATE_* variables in force (they change the engine's configuration); secrets only as set."""
    return {
        k: ("<set>" if any(w in k for w in SECRET_WORDS) else v)
        for k, v in sorted(os.environ.items())
        if k.startswith("SMOLGATE_")
    }


def quick() -> bool:
    return bool(os.environ.get("BENCH_QUICK")) or "--quick" in sys.argv


def provenance() -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    torch = sys.modules.get("torch")
    return {
        "date": now.isoformat(timespec="seconds"),
        "started": STARTED.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - _STARTED_MONOTONIC, 1),
        "command": command(),
        "mode": "quick" if quick() else "full",
        "machine": machine(),
        "commit": commit(),
        "versions": versions(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "settings": settings(),
        "load_avg_1m": {"start": _round(_LOAD_AT_START), "end": _round(load)},
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def machine_label(prov: dict[str, Any]) -> str:
    """One short line for a table: `AMD EPYC (family 25, model 17), 2 cores, 23 GiB (avx2 avx512_vnni avx512_bf16;
    avx512 kernels)`."""
    m = prov.get("machine") or {}
    flags = [f for f in m.get("cpu_flags", []) if f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")]
    cpu = str(m.get("cpu", "?"))
    if m.get("cpu_family"):
        cpu += f" (family {m['cpu_family']}, model {m.get('cpu_model', '?')})"
    parts = [cpu, f"{m.get('cores', '?')} cores"]
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']:.0f} GiB")
    if m.get("gpu"):
        parts.append(str(m["gpu"]))
    isa = f"{m['kernel_isa']} kernels" if m.get("kernel_isa") else ""
    notes = " ".join(flags) + ("; " if flags and isa else "") + isa
    return ", ".join(parts) + (f" ({notes})" if notes else "")


def commit_label(prov: dict[str, Any]) -> str:
    c = prov.get("commit") or {}
    sha = str(c.get("sha") or "unknown")
    return (sha[:10] if sha != "unknown" else sha) + ("-dirty" if c.get("dirty") else "")
