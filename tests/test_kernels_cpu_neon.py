"""The aarch64 NEON GEMMs (kernels/cpu/w4a8_neon.c, w8a8_neon.c), on this x86 machine: cross-compiled with
aarch64-linux-gnu-gcc (build.NEON_FLAGS, OpenMP included, statically linked) into a harness (tests/c/neon_harness.c)
run under qemu-aarch64 -cpu max. The harness checks each kernel against a scalar C reference of the same arithmetic
(exactly, where y is an integer matmul; every W4A8 group size and the group-32 blocks layout GGUF weights run in) and
that every row of an M-row call equals the row computed alone; here the same inputs go through the x86 kernels (AVX2,
and AVX-512 where the CPU has it) and the torch references, which the NEON results must match to fp32 rounding.
Also: build.py's choices on an aarch64 CPU (the platform simulated). On an aarch64 machine the harness is built with
`cc` and run natively (the x86 comparisons skip). Skipped, saying why, where the cross tools are absent (`make
system-deps` installs them)."""

from __future__ import annotations

import platform
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kernels.cpu import build
from kernels.cpu.w4a8 import (
    BLOCK_BYTES,
    W4A8Weight,
    load_w4a8,
    pack_w4a8_blocks,
    unpack_w4a8,
    w4a8_linear,
    w4a8_linear_ref,
)
from kernels.cpu.w8a8 import W8A8Weight, load_w8a8, w8a8_linear, w8a8_linear_ref
from tests.c_kernels import ISAS, requires_c_kernels

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels" / "cpu"
# On an aarch64 machine the harness is built with its own compiler and run as it is; elsewhere cross-built and emulated
NATIVE = build.is_arm()
CROSS_CC, QEMU = ("cc", None) if NATIVE else ("aarch64-linux-gnu-gcc", "qemu-aarch64")
RUN = [] if NATIVE else [QEMU, "-cpu", "max"]
missing = [tool for tool in (CROSS_CC, QEMU) if tool and shutil.which(tool) is None]
requires_tools = pytest.mark.skipif(bool(missing), reason=f"{' and '.join(missing)} absent: `make system-deps` installs them")
GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True)
class Case:
    """One harness run: `kind` w4a8 | w8a8, the NEON output y (M, N) and where its inputs are."""

    kind: str
    name: str
    m: int
    n: int
    k: int
    group: int
    ldx: int
    bias: bool
    gelu: bool
    folder: Path

    def array(self, what: str, dtype: torch.dtype, *shape: int) -> torch.Tensor:
        data = bytearray((self.folder / f"{self.name}.{what}").read_bytes())
        return torch.frombuffer(data, dtype=dtype).reshape(*shape).clone()

    def x(self) -> torch.Tensor:
        """x (M, K) as the harness passed it: the first M rows, ldx floats apart (a strided view)."""
        return self.array("x", torch.float32, -1, self.ldx)[: self.m, : self.k]

    def y(self) -> torch.Tensor:
        return self.array(f"y{self.m}", torch.float32, self.m, self.n)


def cross_compile(out: Path) -> Path:
    """The harness and the NEON kernels as one static aarch64 executable, with build.py's NEON flags."""
    flags = [f for f in build.NEON_FLAGS if f not in {"-shared", "-fPIC"}]  # one static program (libgomp.a)
    exe = out / "neon_harness"
    cmd = [CROSS_CC, *flags, "-static", "-Wall", "-Wextra", "-Werror", f"-I{KERNELS}",
           str(ROOT / "tests" / "c" / "neon_harness.c"), str(KERNELS / "w4a8_neon.c"), str(KERNELS / "w8a8_neon.c"),
           "-lm", "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stderr}"
    return exe


@pytest.fixture(scope="module")
def executable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cross_compile(Path(tmp_path_factory.mktemp("neon-build")))


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory, executable: Path) -> tuple[subprocess.CompletedProcess[str], list[Case]]:
    out, exe = Path(tmp_path_factory.mktemp("neon")), executable
    done = subprocess.run([*RUN, str(exe), str(out)], capture_output=True, text=True, timeout=300)
    cases = []
    for line in done.stdout.splitlines():
        kind, name, *nums = line.split()
        m, n, k, group, ldx, *extra = map(int, nums)
        bias, gelu = (bool(extra[0]), bool(extra[1])) if extra else (False, False)
        cases.append(Case(kind, name, m, n, k, group, ldx, bias, gelu, out))
    return done, cases


@requires_tools
def test_the_neon_kernels_match_the_scalar_reference_under_emulation(harness) -> None:
    """Every case's checks in the harness pass: the scalar reference (exactly for the integer cases) and each row
    independent of its batch-mates, for every group size and M = 1, 3, 4, 17."""
    done, cases = harness
    assert done.returncode == 0, done.stderr
    seen = {(c.kind, c.group, c.m) for c in cases}
    assert {("w4a8", g, m) for g in GROUP_SIZES for m in (1, 3, 4, 17)} <= seen
    assert {("w8a8", g, m) for g in (32, 64) for m in (1, 3, 4, 17)} <= seen
    assert {("w4a8_blocks", 32, m) for m in (1, 3, 4, 17)} <= seen  # GGUF's group-32 blocks layout (ws NULL)
    assert any(c.gelu and c.bias for c in cases) and any(c.name.endswith("_exact") for c in cases)


@requires_tools
@pytest.mark.skipif(NATIVE, reason="needs qemu's CPU models (an x86 host)")
def test_the_kernels_run_the_dot_product_instructions(executable: Path, tmp_path: Path) -> None:
    """On an emulated Cortex-A53 (Armv8.0: no SDOT) the harness dies of an illegal instruction: the kernels do run
    SDOT, and the passing runs above ran it (qemu's `max` CPU has it)."""
    done = subprocess.run([QEMU, "-cpu", "cortex-a53", str(executable), str(tmp_path)], capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGILL, done.stderr


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@requires_tools
@requires_c_kernels
@pytest.mark.parametrize("isa", ISAS)
def test_the_neon_kernels_match_the_x86_kernels_on_the_same_inputs(harness, isa: str, tmp_path: Path) -> None:
    """The NEON output of each case against this machine's kernel and the torch reference (float64) on the harness's
    inputs, read back from its files: fp32 summation order apart, and equal where y is an integer matmul. The torch
    reference unpacks the harness's packed bytes, so the harness packs as w4a8.py does (the blocks layout too: the x86
    kernel reads them repacked into its octets, fp16 scales inline, the reference their float copies)."""
    _, cases = harness
    w4, w8 = load_w4a8(tmp_path, isa), load_w8a8(tmp_path, isa)
    assert w4 is not None and w8 is not None, f"a kernel did not build (see the .log in {tmp_path})"
    assert cases
    for c in cases:
        x, y = c.x(), c.y()
        if c.kind in {"w4a8", "w4a8_blocks"}:
            ng, blocks = c.k // c.group, c.kind == "w4a8_blocks"
            wq = c.array("wq", torch.uint8, c.n, c.k // 64 * BLOCK_BYTES if blocks else c.k // 2)
            w = W4A8Weight(wq, c.array("ws", torch.float32, c.n, ng), c.array("wzt", torch.float32, ng, c.n), c.group,
                           blocks=blocks)
            # x86 serves the same blocks in octets of weight rows (w4a8_blocks.h): the same values, repacked
            x86 = pack_w4a8_blocks(unpack_w4a8(w), w.scales, w.zeros_t.T, octets=True) if blocks else w
            native, ref = w4a8_linear(w4, x, x86), w4a8_linear_ref(x, w)
        else:
            w = W8A8Weight(c.array("w", torch.int8, c.n, c.k), c.array("ws", torch.float32, c.n), c.group)
            bias = c.array("bias", torch.float32, c.n) if c.bias else None
            native, ref = w8a8_linear(w8, x, w, bias, gelu=c.gelu), w8a8_linear_ref(x, w, bias, c.gelu)
        if c.name.endswith("_exact"):
            assert torch.equal(y, native) and torch.equal(y, ref), (c.name, c.m)
        assert rel(y, ref) < 1e-5 and rel(y, native) < 1e-5, (c.name, c.m, isa)


@pytest.mark.skipif(build._compiler() is None, reason="no C compiler (cc/gcc) on PATH")
def test_on_aarch64_the_neon_gemms_are_built_and_the_x86_kernels_fall_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """build.py on an aarch64 CPU (the machine and its /proc/cpuinfo Features simulated): cpu_isa() is neon-dotprod,
    the w4a8 / w8a8 loaders pick the *_neon.c sources, an x86-only kernel is not built (its loader gets None, the
    engine runs torch's op), and a CPU without the dot product gets no C kernels, saying why."""
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(build, "_cpu_flags", lambda: frozenset({"fp", "asimd", "asimddp"}))
    monkeypatch.delenv(build.ISA_ENV, raising=False)
    assert build.c_gemms_unavailable() is None and build.cpu_isa() == "neon-dotprod"
    assert "only the GEMMs (W4A8, W8A8, grouped W8A8)" in (build.c_kernels_unavailable() or "")  # the rest skip
    assert [s.name for s in sorted(KERNELS.glob("*.c")) if build.runs_here(s)] == ["w4a8_neon.c", "w8a8_neon.c", "wg8a8_neon.c"]
    built: list[str] = []
    monkeypatch.setattr(build, "_build", lambda source, target, flags, gomp: built.append(" ".join(flags)) or False)
    assert build.load_c_kernel(KERNELS / "elementwise.c", tmp_path) is None and not built  # x86-only: not compiled
    assert "elementwise.c is x86-only" in caplog.text
    assert load_w4a8(tmp_path) is None and len(built) == 1  # w4a8_neon.c handed to the compiler (here: refused)
    assert built[0].startswith("-O3 -march=armv8.2-a+dotprod -ffp-contract=off") and "avx" not in built[0]
    monkeypatch.setattr(build, "_cpu_flags", lambda: frozenset({"fp", "asimd"}))
    assert "dot-product" in (build.c_gemms_unavailable() or "") and "dot-product" in (build.c_kernels_unavailable() or "")


@requires_tools
@pytest.mark.skipif(NATIVE, reason="the cross compiler (an x86 host)")
@pytest.mark.parametrize("source", ["w4a8_neon.c", "w8a8_neon.c", "wg8a8_neon.c"])
def test_build_py_compiles_the_neon_kernels_into_aarch64_libraries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                    source: str) -> None:
    """build.py's own compile step with its NEON flags (OpenMP included), the cross compiler as CC: a shared library
    for aarch64 (ELF machine 183), as an ARM machine's first load would build (there linked to torch's libgomp)."""
    monkeypatch.setenv("CC", CROSS_CC)
    target = tmp_path / f"{source}.so"
    assert build._build(KERNELS / source, target, build.NEON_FLAGS, None), (tmp_path / f"{Path(source).stem}.log")
    head = target.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183


def test_the_x86_choices_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """On x86 the NEON sources are never built, and SMOLGATE_CPU_ISA=neon-dotprod is refused."""
    if build.is_arm():
        pytest.skip("an ARM CPU")
    assert not build.runs_here(KERNELS / "w4a8_neon.c") and build.runs_here(KERNELS / "w4a8.c")
    monkeypatch.setenv(build.ISA_ENV, "neon-dotprod")
    with pytest.raises(ValueError, match="aarch64"):
        build.cpu_isa()
