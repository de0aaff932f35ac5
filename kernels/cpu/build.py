"""Build the C kernels of kernels/cpu/ (*.c) once, with the system C compiler, and load them with ctypes.

    lib = load_c_kernel(source, build_dir)          # a ctypes.CDLL, or None where it cannot be built
    why = c_kernels_unavailable()                   # None, or why not (not x86 AVX2 + FMA, no compiler)

Built with `cc -O3 -mavx2 -mfma -fopenmp` into `build_dir`, named by a hash of the source and flags (so a
changed kernel is rebuilt, and concurrent processes never load a half-written file: it is renamed into
place), and linked to torch's own OpenMP runtime so the kernels' threads are torch's threads (a second
runtime would make a second pool that fights torch's for the cores). ctypes releases the GIL during a call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

# -ffp-contract=off: a multiply and an add written apart stay apart (the elementwise kernels match torch's rounding;
# the GEMMs' explicit _mm256_fmadd_ps are unaffected)
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp")


def c_kernels_unavailable() -> str | None:
    """Why the C kernels cannot run here (None if they can be built)."""
    if platform.machine() not in {"x86_64", "AMD64"}:
        return f"not an x86-64 CPU ({platform.machine()})"
    if not {"avx2", "fma"} <= _cpu_flags():
        return "the CPU lacks AVX2/FMA"
    if _compiler() is None:
        return "no C compiler (cc/gcc) on PATH"
    return None


@functools.cache
def load_c_kernel(source: Path, build_dir: Path) -> ctypes.CDLL | None:
    """`source` compiled (on first use) into `build_dir` and loaded; None where c_kernels_unavailable() says why
    or the build failed (the compiler's error is then in `build_dir`/<name>.log)."""
    if c_kernels_unavailable() is not None:
        return None
    gomp = _torch_openmp()
    flags = FLAGS if gomp else tuple(f for f in FLAGS if f != "-fopenmp")  # no OpenMP of torch's: one thread
    headers = b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))  # what the source may include
    tag = hashlib.sha256(source.read_bytes() + headers + " ".join(flags).encode() + str(gomp).encode()).hexdigest()[:12]
    target = Path(build_dir) / f"{source.stem}-{tag}.so"
    if not target.exists() and not _build(source, target, flags, gomp):
        return None
    return ctypes.CDLL(str(target))


def _build(source: Path, target: Path, flags: tuple[str, ...], gomp: Path | None) -> bool:
    target.parent.mkdir(parents=True, exist_ok=True)
    link = [f"-L{gomp.parent}", f"-Wl,-rpath,{gomp.parent}", f"-l:{gomp.name}"] if gomp else []
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as tmp:
        cmd = [str(_compiler()), *flags, str(source), "-o", tmp.name, *link]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        (target.parent / f"{source.stem}.log").write_text(" ".join(cmd) + "\n" + done.stderr)
        Path(tmp.name).unlink(missing_ok=True)
        return False
    os.replace(tmp.name, target)
    return True


def _torch_openmp() -> Path | None:
    """torch's bundled OpenMP runtime (libgomp), which the kernels must share."""
    lib = Path(torch.__file__).parent / "lib"
    return next(iter(sorted(lib.glob("libgomp*.so*"))), None)


def _compiler() -> Path | None:
    found = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    return Path(found) if found else None


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()
