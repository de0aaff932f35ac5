"""The grouped GEMM's weight layouts for a GGUF's 4- and 5-bit values (kernels/cpu/wg8a8.py): int8, one byte a value,
against nibbles, two a byte (what a Q4_K, Q4_1 or Q4_0 weight is served in on a CPU:
backend/quant/gguf_grouped.nibble_offset), and for 5-bit values (Q5_0, Q5_1, Q5_K) against the 5-bit layout (nibbles
and a plane of fifth bits).

    python -m bench.gguf_layouts [--rows 1,8,32] [--reps 50]

For each instruction set this CPU runs (AVX2; AVX-512 VNNI where it has it; NEON on aarch64) and each case: Q4_K's
values (0..15, a scale and a term per 32) on Gemma 3 270M's o_proj and down_proj shapes (640 x 1024, 640 x 2048) and
an 8B model's 4096 x 4096, Q4_0's (-8..7, a scale per 32, offset 8) on the 4096 x 4096, and Q5_0's
(-16..15, an fp16 scale per 32, offset 16) on Gemma 3's fused q/k/v and gate/up (1536 x 640, 4096 x 640) and the
4096 x 4096: the weight bytes of each
layout, whether the two give the same bits (they should: the same integer sums, the same float steps), and the best
of 5 timings of `reps` calls per row count, microseconds, with `ratio` (the second layout's time over the first's; under
1 is faster). Then Gemma's 262,144 x 640 Q8_0 table as the tied LM head, its fp16 scales (the file's d, as served)
against the same values widened to float32.
Wall time on torch's threads. The last line is one JSON object, also written to bench/results/gguf_layouts.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.gemm import best_us
from bench.report import default_out, emit
from kernels.cpu.build import NEON_ISA, avx512_available, c_kernels_unavailable, cpu_isa
from kernels.cpu.wg8a8 import GroupedInt8, PackedGrouped, lanes_of, load_wg8a8, pack, wg8a8_linear

# (type, shape name, out, in): the type's value range, offset and terms below; int8 against nibbles
CASES = (("Q4_K", "gemma3_o_proj", 640, 1024), ("Q4_K", "gemma3_down_proj", 640, 2048), ("Q4_K", "8b_proj", 4096, 4096),
         ("Q4_0", "8b_proj", 4096, 4096), ("Q5_0", "gemma3_qkv_proj", 1536, 640),
         ("Q5_0", "gemma3_gate_up_proj", 4096, 640), ("Q5_0", "8b_proj", 4096, 4096))
TYPES = {"Q4_K": (0, 16, 0, True), "Q4_0": (-8, 8, 8, False), "Q5_0": (-16, 16, 16, False)}  # low, high (exclusive),
# offset, terms
SCALES_CASE = ("Q8_0", "gemma3_lm_head", 262144, 640)  # fp32 against fp16 scales (the file's own d)


def compare(lib: Any, isa: str, case: tuple[str, str, int, int], packed: dict[str, PackedGrouped], *,
            rows_list: list[int], reps: int, g: torch.Generator) -> list[dict[str, Any]]:
    """The two layouts in `packed` (the first the reference) at each row count: bits, bytes, best-of-5 microseconds."""
    kind, name, n, k = case
    (a, wa), (b, wb) = packed.items()
    out = []
    for rows in rows_list:
        x = torch.randn(rows, k, generator=g)
        same = torch.equal(wg8a8_linear(lib, x, wa), wg8a8_linear(lib, x, wb))
        us = {lay: best_us(lambda w=w, x=x: wg8a8_linear(lib, x, w), reps) for lay, w in packed.items()}
        out.append({"isa": isa, "type": kind, "shape": name, "out": n, "in": k, "rows": rows, "layouts": [a, b],
                    "same_bits": same, "bytes": {lay: w.nbytes() for lay, w in packed.items()}, "us": us,
                    "ratio": round(us[b] / us[a], 3)})
        print(f"{isa:6s} {kind} {name:18s} rows={rows:<3d} {a} {us[a]:9.1f} us  {b} {us[b]:9.1f} us  "
              f"ratio {out[-1]['ratio']:.2f}  same bits {same}", flush=True)
    return out


def layouts(isa: str, folder: Path, rows_list: list[int], reps: int) -> list[dict[str, Any]]:
    lib = load_wg8a8(folder, isa)
    assert lib is not None, f"the {isa} kernel did not build"
    out = []
    for case in CASES:
        kind, _, n, k = case
        five = kind.startswith("Q5")
        low, high, offset, terms = TYPES[kind]
        g = torch.Generator().manual_seed(n + k)
        scales = torch.rand(n, k // 32, generator=g) * 0.01
        weight = GroupedInt8(torch.randint(low, high, (n, k), dtype=torch.int8, generator=g),
                             scales if terms else scales.half().float(),  # Q4_0's d is fp16 in the file
                             torch.randn(n, k // 32, generator=g) * 0.01 if terms else None)
        second = "five_bits" if five else "nibbles"
        packed = {"int8": pack(weight, lanes_of(lib)),
                  second: pack(weight, lanes_of(lib), nibbles=True, offset=offset, fifth=five)}
        out += compare(lib, isa, case, packed, rows_list=rows_list, reps=reps, g=g)
    kind, _, n, k = SCALES_CASE
    g = torch.Generator().manual_seed(n + k)
    weight = GroupedInt8(torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g),
                         (torch.rand(n, k // 32, generator=g) * 0.01).half().float(), None)
    half = pack(weight, lanes_of(lib))
    packed = {"fp32_scales": dataclasses.replace(half, scales=half.scales.float()), "fp16_scales": half}
    return out + compare(lib, isa, SCALES_CASE, packed, rows_list=rows_list, reps=max(1, reps // 10), g=g)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.gguf_layouts", description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="1,8,32")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    why = c_kernels_unavailable()
    if why:
        raise SystemExit(f"the C kernels cannot run here: {why}")
    isas = [NEON_ISA] if cpu_isa() == NEON_ISA else ["avx2", "avx512"] if avx512_available() else ["avx2"]
    rows_list = [int(r) for r in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        rows = [row for isa in isas for row in layouts(isa, Path(folder), rows_list, args.reps)]
    nib = [r["ratio"] for r in rows if r["layouts"][1] == "nibbles"]
    five = {isa: [r["ratio"] for r in rows if r["isa"] == isa and r["layouts"][1] == "five_bits"] for isa in isas}
    half = [r["ratio"] for r in rows if r["layouts"][1] == "fp16_scales"]
    result = {"bench": "gguf_layouts", "isas": isas, "threads": torch.get_num_threads(), "rows": rows,
              "nibbles_over_int8_range": [min(nib), max(nib)],
              "five_bits_over_int8_by_isa": {isa: [min(r), max(r)] for isa, r in five.items()},
              "fp16_over_fp32_scales_range": [min(half), max(half)],
              "same_bits": all(r["same_bits"] for r in rows)}
    return emit(result, args.out or default_out("gguf_layouts"))


if __name__ == "__main__":
    main()
