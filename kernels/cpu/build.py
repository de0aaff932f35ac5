"""Build the C kernels of kernels/cpu/ (*.c) once, with the system C compiler, and load them with ctypes.

    lib = load_c_kernel(source, build_dir)          # a ctypes.CDLL, or None where it cannot be built
    why = c_kernels_unavailable()                   # None, or why not (not x86 AVX2 + FMA + F16C, no compiler)
    cpu_isa()                                       # "avx512" or "avx2": the variant the dispatching kernels load

Built with `cc -O3 -mavx2 -mfma -mf16c -fopenmp` into `build_dir` (a `*_avx512.c` source adds AVX-512 F/BW/VL + VNNI and
is built only where the CPU runs it), named by a hash of the source and flags (so a
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

# -ffp-contract=off: a multiply and an add written apart stay apart (the elementwise kernels match torch's rounding;
# the GEMMs' explicit _mm256_fmadd_ps are unaffected)
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp")
# What a `*_avx512.c` kernel may use on top: AVX-512 (masks, 256-bit EVEX forms via VL) and vpdpbusd (VNNI: u8 x s8 -> i32)
AVX512_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
AVX512_CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})  # as /proc/cpuinfo names them
ISA_ENV = "SMOLGATE_CPU_ISA"  # auto (default) | avx2: force the AVX2 kernels where AVX-512 would run (tests, A/B)


def c_kernels_unavailable() -> str | None:
    """Why the C kernels cannot run here (None if they can be built)."""
    if platform.machine() not in {"x86_64", "AMD64"}:
        return f"not an x86-64 CPU ({platform.machine()})"
    if not {"avx2", "fma", "f16c"} <= _cpu_flags():  # F16C (fp16 <-> fp32): every AVX2 CPU has it
        return "the CPU lacks AVX2/FMA/F16C"
    if _compiler() is None:
        return "no C compiler (cc/gcc) on PATH"
    return None


def cpu_isa() -> str:
    """The instruction set the dispatching kernels (w4a8, w8a8) run here: "avx512" where the CPU has AVX-512 F/BW/VL
    and VNNI (unless SMOLGATE_CPU_ISA=avx2), else "avx2". Read on every call, so a test can switch it."""
    forced = os.environ.get(ISA_ENV, "auto").strip().lower() or "auto"
    if forced not in {"auto", "avx2", "avx512"}:
        raise ValueError(f"{ISA_ENV}={forced!r}: use auto, avx2 or avx512")
    if forced == "avx2" or not avx512_available():
        return "avx2"
    return "avx512"


def avx512_available() -> bool:
    """Whether this CPU runs the `*_avx512.c` kernels (AVX-512 F/BW/VL and VNNI)."""
    return _cpu_flags() >= AVX512_CPU_FLAGS


@functools.cache
def load_c_kernel(source: Path, build_dir: Path) -> ctypes.CDLL | None:
    """`source` compiled (on first use) into `build_dir` and loaded; None where c_kernels_unavailable() says why,
    where it is an AVX-512 variant (`*_avx512.c`) this CPU cannot run, or where the build failed (the compiler's
    error is then in `build_dir`/<name>.log)."""
    if c_kernels_unavailable() is not None:
        return None
    wide = source.stem.endswith("_avx512")
    if wide and not avx512_available():
        return None
    gomp = _torch_openmp()
    flags = FLAGS if gomp else tuple(f for f in FLAGS if f != "-fopenmp")  # no OpenMP of torch's: one thread
    flags = flags[:3] + AVX512_FLAGS + flags[3:] if wide else flags
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
    """torch's bundled OpenMP runtime (libgomp), which the kernels must share. torch is imported here, not at the top,
    so bench/provenance.py can ask cpu_isa() without loading torch."""
    import torch

    lib = Path(torch.__file__).parent / "lib"
    return next(iter(sorted(lib.glob("libgomp*.so*"))), None)


def _compiler() -> Path | None:
    found = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    return Path(found) if found else None


@functools.cache
def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((frozenset(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), frozenset())
    except OSError:
        return frozenset()
