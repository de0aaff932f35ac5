"""bench.gpu's code paths on the CPU (--dry-run): toy shapes, every section, kernels checked against their references.

On a GPU the same script measures (python -m bench.gpu); here it must run end to end, so a lent GPU's few minutes are
not spent finding a typo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from bench import gpu_models

REPO = Path(__file__).resolve().parent.parent


def tokenizer() -> Path:
    carried = REPO / ".gpu_assets" / "tokenizer"
    if (carried / "tokenizer.json").exists():
        return carried
    from backend.config import default_model_path

    return default_model_path()


def test_dry_run_covers_every_section(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.gpu", "--dry-run", "--only", "ceilings,kernels,engine,hf",
         "--formats", "bf16,awq,gguf,grouped", "--work", str(tmp_path / "work"), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])  # the last line is the result
    assert last == json.loads(out.read_text())
    assert last["errors"] == {}
    assert [s.split(" ")[0] for s in last["skipped"]] == ["toy-gemma/awq", "toy-gemma/gguf"]  # Gemma: bf16, grouped
    kernels = [row for rows in last["kernels"].values() for row in rows]
    assert {r["kernel"] for r in kernels} == {"w4a16_gemm", "grouped_int8_gemm", "paged_decode", "flash_prefill"}
    assert all(r["rel_err"] < 2e-2 for r in kernels), kernels
    assert {(e["model"], e["format"], tuple(e["decode"])) for e in last["engine"]} == {
        *(("toy", f, ("1", "32", "128")) for f in ("bf16", "awq", "gguf", "grouped")),
        *(("toy-gemma", f, ("1", "32", "128")) for f in ("bf16", "grouped"))}
    for e in last["engine"]:  # a grouped checkpoint runs the GGUF layers, every K-quant form of the mix among them
        if e["format"] == "grouped":
            assert {k.split(",")[0] + "," + k.split(",")[1] for k in e["kernels"]} == {
                "GgufLinear(group=16, zeros=False", "GgufLinear(group=32, zeros=False",
                "GgufLinear(group=32, zeros=True"}
    bf16 = next(e for e in last["engine"] if e["format"] == "bf16")
    assert bf16["greedy_graphs_check"]["identical"] == 32  # no graphs on a CPU: the same engine path twice
    assert set(last["hf"]["toy"]) == {"compiled", "1", "128"}
    assert set(last["targets"]) >= {"1b_bf16_hbm_roofline_share_1_stream", "8b_int4_vs_bf16_1_stream"}


def test_weight_bytes_per_step_counts_what_a_decode_step_reads(tmp_path: Path) -> None:
    """Every projection and norm once, the tied embedding once (as the LM head): the arithmetic of the shapes."""
    from bench.gpu import make_engine, weight_bytes_per_step

    sh = gpu_models.shape("toy")
    model_dir = gpu_models.write_checkpoint(sh, "bf16", tmp_path / "toy", tokenizer(), device="cpu")
    engine = make_engine(model_dir, "cpu", dry=True, packed_copy=False)
    c = sh.config
    per_layer = sum(o * i for o, i in sh.projections().values()) + 2 * c["hidden_size"]
    expected = (sh.layers * per_layer + c["vocab_size"] * c["hidden_size"] + c["hidden_size"]) * 4  # fp32 on a CPU
    assert weight_bytes_per_step(engine.runner.model) == expected
    assert engine.runner.model.embed_tokens.weight.dtype == torch.float32


def test_grouped_weight_bytes_are_the_mix_s_own(tmp_path: Path) -> None:
    """Gemma's toy in the grouped format: each projection int8 plus a float32 scale per group (and a term per 32
    where the K-quant has a minimum), the tied head once over the embedding's tensors; norms in float32."""
    from bench.gpu import make_engine, weight_bytes_per_step

    sh = gpu_models.shape("toy-gemma")
    model_dir = gpu_models.write_checkpoint(sh, "grouped", tmp_path / "toy-gemma", tokenizer(), device="cpu")
    engine = make_engine(model_dir, "cpu", dry=True)

    def grouped(out_f: int, in_f: int, group: int, terms: bool) -> int:
        return out_f * in_f + 4 * (out_f * in_f // group + (out_f * in_f // 32 if terms else 0))

    c = sh.config
    expected = grouped(c["vocab_size"], c["hidden_size"], *gpu_models.GROUPED_MIX["embed_tokens"])
    for layer in range(sh.layers):
        for name, (out_f, in_f) in sh.projections().items():
            expected += grouped(out_f, in_f, *gpu_models.grouped_mix(name, layer))
        expected += 4 * (4 * c["hidden_size"] + 2 * c["head_dim"])  # Gemma's four norms and QK-norm
    expected += 4 * c["hidden_size"]
    assert weight_bytes_per_step(engine.runner.model) == expected
