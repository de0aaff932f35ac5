"""Build the C kernels of kernels/cpu/ (*.c) once, with the system C compiler, and load them with ctypes.

    lib = load_c_kernel(source, build_dir)          # a ctypes.CDLL, or None where it cannot be built or run here
    why = c_kernels_unavailable()                   # None, or why not all of them (not x86 AVX2 + FMA + F16C, no compiler)
    why = c_gemms_unavailable()                     # the same for the W4A8 / W8A8 GEMMs (on aarch64: NEON dot product)
    cpu_isa()                                       # "avx512", "avx2" or "neon-dotprod": the dispatching kernels' variant

On x86-64, built with `cc -O3 -mavx2 -mfma -mf16c -fopenmp` into `build_dir` (a `*_avx512.c` source adds AVX-512
F/BW/VL + VNNI and is built only where the CPU runs it). On aarch64 (where the CPU has the Armv8.2 dot-product
instructions) only the `*_neon.c` sources are built, with `-march=armv8.2-a+dotprod` (fp16 <-> fp32 conversion is
part of the base instruction set there): the W4A8 and W8A8 GEMMs; the other kernels are x86-only, so their loaders
get None (logged once each) and the engine runs torch's ops for them. Each library is named by a hash of the source
and flags (so a changed kernel is rebuilt, and concurrent processes never load a half-written file: it is renamed
into place), and linked to torch's own OpenMP runtime so the kernels' threads are torch's threads (a second runtime
would make a second pool that fights torch's for the cores). ctypes releases the GIL during a call.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

# -ffp-contract=off: a multiply and an add written apart stay apart (the elementwise kernels match torch's rounding;
# the GEMMs' explicit _mm256_fmadd_ps are unaffected)
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp")
# What a `*_avx512.c` kernel may use on top: AVX-512 (masks, 256-bit EVEX forms via VL) and vpdpbusd (VNNI: u8 x s8 -> i32)
AVX512_FLAGS = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")
AVX512_CPU_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})  # as /proc/cpuinfo names them
# aarch64: what every kernel there is built with (SDOT/UDOT: int8 dot products, four a 32-bit lane; Apple M1 and later,
# AWS Graviton 2 and later); the same -ffp-contract=off reason as on x86
NEON_FLAGS = ("-O3", "-march=armv8.2-a+dotprod", "-ffp-contract=off", "-shared", "-fPIC", "-fopenmp")
NEON_CPU_FEATURE = "asimddp"  # as /proc/cpuinfo's Features line names the dot-product extension on Linux
ISA_ENV = "SMOLGATE_CPU_ISA"  # auto (default) | avx2: the AVX2 kernels where AVX-512 would run (tests, A/B); aarch64 ignores it
NEON_ISA = "neon-dotprod"  # cpu_isa() on aarch64

log = logging.getLogger(__name__)


def is_arm() -> bool:
    """Whether this is a 64-bit ARM CPU (Linux says aarch64, macOS arm64)."""
    return platform.machine().lower() in {"aarch64", "arm64"}


def c_kernels_unavailable() -> str | None:
    """Why the whole set of C kernels cannot run here (None if it can be built: x86-64 with AVX2 + FMA + F16C). On aarch64
    only the GEMMs can (c_gemms_unavailable), so this names why the rest cannot."""
    if is_arm():
        return c_gemms_unavailable() or "an aarch64 CPU: only the GEMMs (W4A8, W8A8, grouped W8A8) have C (NEON) variants there"
    if platform.machine() not in {"x86_64", "AMD64"}:
        return f"neither an x86-64 nor an aarch64 CPU ({platform.machine()})"
    if not {"avx2", "fma", "f16c"} <= _cpu_flags():  # F16C (fp16 <-> fp32): every AVX2 CPU has it
        return "the CPU lacks AVX2/FMA/F16C"
    if _compiler() is None:
        return "no C compiler (cc/gcc) on PATH"
    return None


def c_gemms_unavailable() -> str | None:
    """Why the W4A8 / W8A8 GEMMs cannot run here (None if they can be built): on aarch64 the NEON variants need the
    dot-product instructions and a compiler; elsewhere they build with the rest (c_kernels_unavailable)."""
    if not is_arm():
        return c_kernels_unavailable()
    if not _arm_dotprod():
        return f"the ARM CPU lacks the Armv8.2 dot-product instructions ({NEON_CPU_FEATURE})"
    return None if _compiler() is not None else "no C compiler (cc/gcc) on PATH"


def cpu_isa() -> str:
    """The instruction set the dispatching kernels (w4a8, w8a8) run here: on x86, "avx512" where the CPU has AVX-512
    F/BW/VL and VNNI (unless SMOLGATE_CPU_ISA=avx2), else "avx2"; on aarch64 "neon-dotprod" (the one variant there).
    Read on every call, so a test can switch it."""
    forced = os.environ.get(ISA_ENV, "auto").strip().lower() or "auto"
    if forced not in {"auto", "avx2", "avx512", NEON_ISA}:
        raise ValueError(f"{ISA_ENV}={forced!r}: use auto, avx2, avx512 (x86) or {NEON_ISA} (aarch64)")
    if is_arm():
        return NEON_ISA
    if forced == NEON_ISA:
        raise ValueError(f"{ISA_ENV}={NEON_ISA}: the NEON kernels run only on aarch64")
    if forced == "avx2" or not avx512_available():
        return "avx2"
    return "avx512"


def avx512_available() -> bool:
    """Whether this CPU runs the `*_avx512.c` kernels (AVX-512 F/BW/VL and VNNI)."""
    return _cpu_flags() >= AVX512_CPU_FLAGS


def runs_here(source: Path) -> bool:
    """Whether `source` is a kernel for this CPU: on aarch64 the `*_neon.c` ones; on x86 the others (`*_avx512.c`
    only where the CPU has AVX-512 + VNNI)."""
    if is_arm():
        return source.stem.endswith("_neon")
    return not source.stem.endswith("_neon") and (avx512_available() or not source.stem.endswith("_avx512"))


@functools.cache
def load_c_kernel(source: Path, build_dir: Path) -> ctypes.CDLL | None:
    """`source` compiled (on first use) into `build_dir` and loaded; None where c_gemms_unavailable() says why (no
    C kernel at all builds here), where it is not for this CPU (runs_here: an AVX-512 variant without AVX-512, an x86
    kernel on aarch64 (logged: torch's ops run instead), a NEON one on x86), or where the build failed (the compiler's
    error is then in `build_dir`/<name>.log)."""
    if c_gemms_unavailable() is not None:
        return None
    if not runs_here(source):
        if is_arm():
            log.warning("C kernel %s is x86-only; on this aarch64 CPU torch's ops run in its place", source.name)
        return None
    wide = source.stem.endswith("_avx512")
    base = NEON_FLAGS if is_arm() else FLAGS
    gomp = _torch_openmp()
    flags = base if gomp else tuple(f for f in base if f != "-fopenmp")  # no OpenMP of torch's: one thread
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
    # a first start compiles several kernels (about 10 s on 2 cores): say what the wait is, once per kernel
    log.info("compiling C kernel %s for this CPU (once; kept in %s)", source.name, target.parent)
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        (target.parent / f"{source.stem}.log").write_text(" ".join(cmd) + "\n" + done.stderr)
        Path(tmp.name).unlink(missing_ok=True)
        log.warning("C kernel %s did not compile: %s says why", source.name,
                    target.parent / f"{source.stem}.log")
        return False
    os.replace(tmp.name, target)
    log.info("compiled %s in %.1f s", source.name, time.monotonic() - started)
    return True


def _torch_openmp() -> Path | None:
    """torch's bundled OpenMP runtime (libgomp), which the kernels must share. torch is imported here, not at the top,
    so bench/provenance.py can ask cpu_isa() without loading torch."""
    import torch

    lib = Path(torch.__file__).parent / "lib"
    # torch/lib on x86 and in recent aarch64 wheels; auditwheel's torch.libs/ (libgomp-<hash>.so.1.0.0) in older
    # aarch64 ones (torch 2.5)
    return next(iter([*sorted(lib.glob("libgomp*.so*")), *sorted((lib.parent.parent / "torch.libs").glob("libgomp*.so*"))]),
                None)


def _compiler() -> Path | None:
    found = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    return Path(found) if found else None


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """/proc/cpuinfo's first `flags` line (x86) or `Features` line (aarch64), as a set."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((frozenset(line.split(":", 1)[1].split()) for line in f if line.startswith(("flags", "Features"))),
                        frozenset())
    except OSError:
        return frozenset()


def _arm_dotprod() -> bool:
    """Linux lists the extension in /proc/cpuinfo; macOS has no such file, and every Apple silicon CPU has it (M1 on)."""
    return NEON_CPU_FEATURE in _cpu_flags() or platform.system() == "Darwin"
