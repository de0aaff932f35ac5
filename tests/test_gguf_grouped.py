"""A GGUF file's blocks served in their own bits (backend/quant/gguf_types.py, gguf_grouped.py, kernels/cpu/wg8a8.c).

What holds, and is checked here:
- every served block type decodes to the values gguf-py's reference dequantization gives, bit for bit (random blocks:
  every bit pattern of the quants, scales and minimums, with finite fp16 fields), and a type not served says so;
- the grouped W8A8 kernel computes the reference arithmetic (float64 torch) for groups of 16 and 32, with and without
  terms, and a row's result does not depend on the other rows of the call;
- Gemma 3 270M's Q4_K_M file (Q5_0, Q4_K, Q8_0, Q6_K): every weight kept equals transformers' dequantized copy bit for
  bit, every other tensor too;
- served with `quantization: auto`: every projection and the tied embedding/head in their own bits, the weights'
  bytes within 1.3x the file's, and greedy output against the full-precision reference (the same weights as float32,
  equal to HF's: tests/test_gemma3_gguf.py): the activations' int8 rounding per 32 (llama.cpp's Q8 activations do the
  same) may move a greedy choice only at a near tie, and the reference's tokens keep their log-probabilities within a
  stated tolerance; a prompt's tokens do not depend on its batch-mates.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.fetch import fetch_gemma_gguf
from backend.model.weights import resolve_model_dir
from backend.quant.gguf_grouped import grouped_of, is_gguf_grouped, nibble_offset
from backend.quant.gguf_linear import GgufEmbedding, GgufLinear
from backend.quant.gguf_types import SERVED, decode
from backend.quant.kept_output import KeptOutput
from kernels.cpu import build as build_py
from kernels.cpu.wg8a8 import GroupedInt8, lanes_of, load_wg8a8, pack, wg8a8_linear, wg8a8_linear_ref
from tests.c_kernels import ISAS, build, requires_avx512, requires_c_kernels
from tests.engine_helpers import (
    assert_no_leaks,
    greedy_reference,
    run_to_completion,
    save_grouped_model,
    teacher_forced,
    token_ids,
)

# byte offsets of each type's fp16 fields (d, m / dmin) within a block: set to finite values (random bytes may be NaN)
FP16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q3_K": [108], "Q4_K": [0, 2],
           "Q5_K": [0, 2], "Q6_K": [208]}
TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
         "The three primary colors are", "Water boils at a temperature of", "import numpy as np\n"]
NEW = 24
NEAR_TIE = 0.75  # nats between the reference's best two tokens (tests/test_gguf_blocks.py's bar for the W4A8 path)
MEAN_DRIFT, P90_DRIFT = 0.15, 0.4  # |log p| of the reference's tokens, served vs reference (the same bars)


@pytest.mark.parametrize("kind", SERVED)
def test_each_type_decodes_bit_for_bit_as_gguf_py(kind: str) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[kind]
    block, size = GGML_QUANT_SIZES[qtype]
    out, k = 6, 512
    rng = np.random.default_rng(sum(map(ord, kind)))
    raw = rng.integers(0, 256, size=(out, k // block * size), dtype=np.uint8)
    blocks = raw.reshape(-1, size)
    for at in FP16_AT[kind]:
        blocks[:, at:at + 2] = rng.normal(0, 0.05, size=len(blocks)).astype(np.float16).view(np.uint8).reshape(-1, 2)
    ref = torch.from_numpy(np.ascontiguousarray(dequantize(raw, qtype), dtype=np.float32)).reshape(out, k)
    grouped = decode(kind, raw, (out, k))
    assert grouped is not None and grouped.group == (16 if kind in ("Q3_K", "Q6_K") else 32)
    assert torch.equal(grouped.dequantized().view(torch.int32), ref.view(torch.int32))  # the bits, signed zeros too
    rows = torch.tensor([4, 0, 4])
    assert torch.equal(grouped.dequantized(rows), ref[rows])  # the embedding's lookup
    offset = nibble_offset(grouped)  # the 4-bit types, two values a byte: the same bits again
    assert offset == {"Q4_0": 8, "Q4_1": 0, "Q4_K": 0}.get(kind), kind
    if offset is not None:
        packed = pack(grouped, 8, nibbles=True, offset=offset)
        assert torch.equal(packed.dequantized().view(torch.int32), ref.view(torch.int32))
        assert torch.equal(packed.rows(rows), ref[rows])
        terms = grouped.zeros is not None  # half a byte a value, a scale (fp16 where it is one: Q4_0's, Q4_1's d) and term a 32
        assert packed.scales.dtype == (torch.float32 if kind == "Q4_K" else torch.float16), kind
        assert packed.nbytes() == packed.padded * (k // 2 + k // 32 * (packed.scales.element_size() + 4 * terms)), kind
    five = nibble_offset(grouped, bits=5)  # the 5-bit layout: the 4- and 5-bit types, the same bits again
    assert five == {"Q4_0": 16, "Q4_1": 0, "Q4_K": 0, "Q5_0": 16, "Q5_1": 0, "Q5_K": 0}.get(kind), kind
    for lanes in (8, 16) if five is not None else ():  # AVX2 and NEON's octets of rows, AVX-512's hexadecets
        packed = pack(grouped, lanes, nibbles=True, offset=five, fifth=True)
        assert torch.equal(packed.dequantized().view(torch.int32), ref.view(torch.int32))
        assert torch.equal(packed.rows(rows), ref[rows])
        terms = grouped.zeros is not None  # 5 bits a value, and the scale and term a 32
        assert packed.nbytes() == packed.padded * (k // 2 + k // 8 + k // 32 * (packed.scales.element_size() + 4 * terms))


def test_a_type_not_served_is_left_to_the_caller() -> None:
    assert decode("Q2_K", np.zeros((2, 84), np.uint8), (2, 256)) is None
    assert decode("F16", np.zeros((2, 64), np.uint8), (2, 32)) is None
    assert decode("Q4_K", np.zeros((2, 144), np.uint8), (2, 288)) is None  # rows not whole super-blocks


@pytest.fixture(scope="module", params=ISAS)
def lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> object:
    return build(partial(load_wg8a8, isa=request.param), tmp_path_factory, f"wg8a8-{request.param}")


@requires_c_kernels
@pytest.mark.parametrize("group", [16, 32])
@pytest.mark.parametrize("zeros", [False, True], ids=["symmetric", "terms"])
def test_the_kernel_computes_the_reference_arithmetic(lib: object, group: int, zeros: bool) -> None:
    torch.manual_seed(group + zeros)
    n, k, m = 45, 640, 37  # 45 rows: the last octet (hexadecet) padded; 37 rows of x: every tile of both kernels
    q = torch.randint(-128, 128, (n, k), dtype=torch.int8)  # -128 too: |q| * x's sign stays within int16
    g = GroupedInt8(q, torch.rand(n, k // group) * 0.01, torch.randn(n, k // 32) * 0.01 if zeros else None)
    w = pack(g, lanes_of(lib))  # type: ignore[arg-type]
    assert torch.equal(w.dequantized(), g.dequantized()) and torch.equal(w.rows(torch.tensor([44, 3])), g.dequantized()[[44, 3]])
    x = torch.randn(m, k) * 3
    y = wg8a8_linear(lib, x, w)  # type: ignore[arg-type]
    ref = wg8a8_linear_ref(x, g)
    assert (y - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()
    alone = torch.cat([wg8a8_linear(lib, x[i:i + 1], w) for i in range(m)])  # type: ignore[arg-type]
    assert torch.equal(alone, y)
    exact = x @ g.dequantized().T  # what int8 activations per 32 cost: well under a percent of the output's scale
    assert ((y - exact).norm() / exact.norm()).item() < 0.01


@requires_c_kernels
@pytest.mark.parametrize(("low", "high", "offset"), [(0, 16, 0), (-8, 8, 8)], ids=["Q4_K", "Q4_0"])
@pytest.mark.parametrize("zeros", [False, True], ids=["symmetric", "terms"])
def test_the_nibble_layout_gives_the_int8_layouts_bits(lib: object, low: int, high: int, offset: int, zeros: bool) -> None:
    """The nibble layout (wg4a8_linear) holds u = q + offset two a byte; its integer sums (started at -offset times
    x's group sums) and every float step after them are the int8 layout's, so the same weights give the same bits, at
    every tile of x."""
    torch.manual_seed(7 + zeros + offset)
    n, k, m = 45, 640, 37
    g = GroupedInt8(torch.randint(low, high, (n, k), dtype=torch.int8), torch.rand(n, k // 32) * 0.01,
                    torch.randn(n, k // 32) * 0.01 if zeros else None)
    w8, w4 = pack(g, lanes_of(lib)), pack(g, lanes_of(lib), nibbles=True, offset=offset)  # type: ignore[arg-type]
    assert w4.q.numel() * 2 == w8.q.numel() and w4.shape == w8.shape == (n, k)
    assert torch.equal(w4.dequantized().view(torch.int32), g.dequantized().view(torch.int32))
    assert torch.equal(w4.rows(torch.tensor([44, 3])), g.dequantized()[[44, 3]])
    x = torch.randn(m, k) * 3
    y = wg8a8_linear(lib, x, w4)  # type: ignore[arg-type]
    assert torch.equal(y, wg8a8_linear(lib, x, w8))  # type: ignore[arg-type]
    assert torch.equal(torch.cat([wg8a8_linear(lib, x[i:i + 1], w4) for i in range(m)]), y)  # type: ignore[arg-type]


@requires_c_kernels
@pytest.mark.parametrize(("low", "high", "offset"), [(-16, 16, 16), (0, 32, 0), (-8, 8, 16)], ids=["Q5_0", "Q5_K", "Q4_0"])
@pytest.mark.parametrize("zeros", [False, True], ids=["symmetric", "terms"])
@pytest.mark.parametrize("half", [False, True], ids=["fp32_scales", "fp16_scales"])
def test_the_5_bit_layout_gives_the_int8_layouts_bits(lib: object, low: int, high: int, offset: int, zeros: bool,
                                                      half: bool) -> None:
    """The 5-bit layout (wg5a8_linear) holds u = q + offset's low four bits as the nibble layout does and its fifth bits
    in a plane, a byte per position of a group's chunks (bit c for chunk c), added back as 16: the int8 layout's integer
    sums, so its bits, at every tile of x (AVX-512: 6, 4 and 1 rows, one hexadecet and two, unpacked once from 12 rows;
    AVX2: 4 and 1 rows, unpacked once from 8), in 0.69 bytes a value with an fp16 scale."""
    torch.manual_seed(13 + zeros + offset + half)
    n, k = 77, 640  # 77 rows: the last chunk of rows padded, and two hexadecets a tile from 16 rows of x on
    scales = torch.rand(n, k // 32) * 0.01
    g = GroupedInt8(torch.randint(low, high, (n, k), dtype=torch.int8), scales.half().float() if half else scales,
                    torch.randn(n, k // 32) * 0.01 if zeros else None)
    lanes = lanes_of(lib)  # type: ignore[arg-type]
    w8, w5 = pack(g, lanes), pack(g, lanes, nibbles=True, offset=offset, fifth=True)
    assert w5.shape == w8.shape == (n, k) and (w5.scales.dtype == torch.float16) == half
    assert torch.equal(w5.dequantized().view(torch.int32), g.dequantized().view(torch.int32))
    assert torch.equal(w5.rows(torch.tensor([76, 3, 17])), g.dequantized()[[76, 3, 17]])
    for m in (1, 5, 7, 8, 23, 37):
        x = torch.randn(m, k) * 3
        y = wg8a8_linear(lib, x, w5)  # type: ignore[arg-type]
        assert torch.equal(y, wg8a8_linear(lib, x, w8)), m  # type: ignore[arg-type]
    assert torch.equal(torch.cat([wg8a8_linear(lib, x[i:i + 1], w5) for i in range(m)]), y)  # type: ignore[arg-type]
    if half and not zeros and offset == 16 and low == -16:  # Q5_0 as served: 0.69 bytes a value against 1.06
        assert w5.nbytes() / (w5.padded * k) == 0.6875 and w8.nbytes() / (w8.padded * k) == 1.0625


@requires_c_kernels
@pytest.mark.parametrize("offset", [None, 8], ids=["int8", "nibbles"])
def test_fp16_scales_give_the_float32_scales_bits(lib: object, offset: int | None) -> None:
    """Where every scale is an fp16 value (a GGUF type's own d: Q8_0, Q5_0, Q4_0, ...) the layout keeps them in fp16,
    half their bytes, and the kernel widens them to the same float32 values: the same bits as float32 scales."""
    torch.manual_seed(11)
    n, k, m = 45, 640, 37
    g = GroupedInt8(torch.randint(-8, 8, (n, k), dtype=torch.int8), (torch.rand(n, k // 32) * 0.01).half().float(), None)
    w = pack(g, lanes_of(lib), nibbles=offset is not None, offset=offset or 0)  # type: ignore[arg-type]
    wide = dataclasses.replace(w, scales=w.scales.float())
    assert w.scales.dtype == torch.float16 and wide.nbytes() - w.nbytes() == w.scales.numel() * 2
    assert torch.equal(w.dequantized(), g.dequantized())
    x = torch.randn(m, k)
    assert torch.equal(wg8a8_linear(lib, x, w), wg8a8_linear(lib, x, wide))  # type: ignore[arg-type]
    assert pack(GroupedInt8(g.q, g.scales + 1e-7, None), 8).scales.dtype == torch.float32  # not fp16 values: as they are


def test_only_4_bit_values_in_groups_of_32_take_the_nibble_layout() -> None:
    torch.manual_seed(5)
    scales = torch.rand(16, 2)
    q = torch.randint(-8, 8, (16, 64), dtype=torch.int8)
    assert [nibble_offset(GroupedInt8(q * f, scales, None)) for f in (1, 2)] == [8, None]  # 4 bits, 5 bits
    assert [nibble_offset(GroupedInt8(q * f, scales, None), bits=5) for f in (2, 3)] == [16, None]  # 5 bits, 6 bits
    assert nibble_offset(GroupedInt8(q + 8, scales, scales)) == 0
    assert nibble_offset(GroupedInt8(q, torch.rand(16, 4), None)) is None  # groups of 16 (Q6_K, Q3_K)
    with pytest.raises(AssertionError, match="nibbles"):
        pack(GroupedInt8(q * 2, scales, None), 8, nibbles=True, offset=8)  # -16 + 8 is not in 0..15


@requires_c_kernels
def test_a_kept_output_gives_the_same_logits_in_one_tensor(lib: object) -> None:
    """The LM head's kept output (backend/quant/kept_output.py): each call's values are a fresh call's, calls of up to
    MAX_ROWS rows write into the one tensor (made anew where a call has more rows), longer ones get their own."""
    torch.manual_seed(3)
    g = GroupedInt8(torch.randint(-128, 128, (48, 64), dtype=torch.int8), torch.rand(48, 2) * 0.01, None)
    fresh, kept = GgufLinear(pack(g, lanes_of(lib)), lib), GgufLinear(pack(g, lanes_of(lib)), lib)  # type: ignore[arg-type]
    kept.kept_output = KeptOutput()
    storages = []
    for m in (4, 9, 2, KeptOutput.MAX_ROWS + 1):
        x = torch.randn(m, 64)
        y = kept(x)
        assert torch.equal(y, fresh(x))
        storages.append(y.untyped_storage().data_ptr())
    assert storages[1] == storages[2] != storages[3]  # made anew once for 9 rows, then reused; past MAX_ROWS its own


@requires_c_kernels
def test_a_large_output_written_past_the_caches_has_the_same_bits(lib: object) -> None:
    """From 8 MB of output (an LM head's logits at 32 rows of x) the AVX-512 tiles store it with non-temporal stores
    where it is 64-byte aligned: the same values as the rows computed alone (small outputs, stored through the caches)
    and as an output that is not aligned; the next rows' weights asked of L2 ahead change no value."""
    torch.manual_seed(4)
    n, k, m = 32768, 64, 64  # y: 64 x 32,768 floats, 8.4 MB
    g = GroupedInt8(torch.randint(-128, 128, (n, k), dtype=torch.int8), torch.rand(n, 2).half().float(), None)
    w = pack(g, lanes_of(lib))  # type: ignore[arg-type]
    x = torch.randn(m, k)
    y = wg8a8_linear(lib, x, w)  # type: ignore[arg-type]
    assert y.data_ptr() % 64 == 0
    alone = torch.cat([wg8a8_linear(lib, x[i:i + 1], w) for i in range(0, m, 8)])  # type: ignore[arg-type]
    assert torch.equal(alone, y[::8])
    unaligned = torch.empty(m * n + 1)[1:].view(m, n)
    assert torch.equal(wg8a8_linear(lib, x, w, out=unaligned), y)  # type: ignore[arg-type]
    ref = wg8a8_linear_ref(x, g)
    assert (y - ref).abs().max().item() <= 1e-5 * ref.abs().max().item()


@requires_avx512
def test_avx2_and_avx512_give_the_same_bits(tmp_path_factory: pytest.TempPathFactory) -> None:
    libs = [build(partial(load_wg8a8, isa=isa), tmp_path_factory, f"wg8a8-same-{isa}") for isa in ("avx2", "avx512")]
    torch.manual_seed(1)
    g = GroupedInt8(torch.randint(-128, 128, (80, 256), dtype=torch.int8), torch.rand(80, 16), torch.randn(80, 8))
    for m in (5, 23):  # AVX-512 reads one hexadecet a tile below 16 rows of x, two from 16 on (80 rows: 2 + 2 + 1)
        x = torch.randn(m, 256)
        y = [wg8a8_linear(lib, x, pack(g, lanes_of(lib))) for lib in libs]  # type: ignore[arg-type]
        assert torch.equal(y[0], y[1])


@pytest.fixture(scope="module")
def gguf() -> Path:
    return fetch_gemma_gguf()


def test_gemma_weights_kept_are_the_reference_weights(gguf: Path) -> None:
    grouped_dir, dense_dir = resolve_model_dir(gguf, gguf_blocks=True), resolve_model_dir(gguf)
    assert is_gguf_grouped(grouped_dir) and not is_gguf_grouped(dense_dir)
    with safe_open(str(grouped_dir / "model.safetensors"), "pt") as g, safe_open(str(dense_dir / "model.safetensors"), "pt") as d:
        kept = {k: g.get_tensor(k) for k in g.keys()}  # noqa: SIM118 (safe_open is not a dict)
        stems = sorted({k.rsplit(".", 1)[0] for k in kept if k.endswith(".gq")})
        assert len(stems) == 18 * 7 + 1  # every projection, and the embedding table (tied: the head)
        for stem in stems:
            w = grouped_of(kept, stem)
            assert w is not None
            assert torch.equal(w.dequantized().view(torch.int32), d.get_tensor(f"{stem}.weight").view(torch.int32)), stem
        others = sorted(set(d.keys()) - {f"{stem}.weight" for stem in stems})
        assert sorted(kept) == others  # grouped_of took the kept weights' tensors out of `kept`
        for name, t in kept.items():
            assert torch.equal(t, d.get_tensor(name)), name


@pytest.fixture(scope="module")
def reference(gguf: Path) -> dict[str, object]:
    """The full-precision engine's greedy tokens, their top-2 margins and teacher-forced log-probabilities."""
    return greedy_reference(LLMEngine(EngineConfig(model=str(gguf), quantization="none", packed_copy=False)), TEXTS, NEW)


@requires_c_kernels
def test_gemma_served_in_its_own_bits(gguf: Path, reference: dict, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="backend.model.weights"):
        engine = LLMEngine(EngineConfig(model=str(gguf), quantization="auto"))
    line = next(r.getMessage() for r in caplog.records if "own bits" in r.getMessage())
    types = "Q5_0 x81, Q4_K x27, Q8_0 x10, Q6_K x9"
    assert line == f"gemma-3-270m-q4_k_m.gguf: {types} served in their own bits (grouped int8 kernel)"
    model = engine.runner.model
    assert isinstance(model.embed_tokens, GgufEmbedding) and isinstance(model.lm_head, GgufLinear)
    assert model.lm_head.weight_q is model.embed_tokens.weight_q  # the tied table held once
    assert model.lm_head.kept_output is not None and not any(  # the head's logits tensor is kept; no other's
        m.kept_output for m in model.modules() if isinstance(m, GgufLinear) and m is not model.lm_head)
    linears = [m for m in model.modules() if isinstance(m, GgufLinear)]
    assert len(linears) == 18 * 4 + 1 and all(m.lib is not None for m in linears)
    four = sum(m.weight_q.nibbles and m.weight_q.fifth is None for m in linears)
    assert four == 27  # the Q4_K projections (o_proj, half the down_proj): 4 bits
    five = sum(m.weight_q.fifth is not None for m in linears)  # Q5_0's: every gate_up, and the q/k/v where v is too
    assert five == 27
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())  # no float copy of any projection
    weight_bytes = sum(m.weight_bytes() for m in linears[:-1]) + model.embed_tokens.weight_bytes()
    assert weight_bytes < 1.3 * gguf.stat().st_size, (weight_bytes, gguf.stat().st_size)

    greedy = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    prompts, want_all = reference["prompts"], reference["tokens"]
    outs = run_to_completion(engine, {0: [(f"r{i}", p, greedy) for i, p in enumerate(prompts)]})
    for i, want in enumerate(want_all):
        got = token_ids(outs[f"r{i}"])
        first = next((j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        margin = reference["margins"][i][first] if first is not None else 0.0
        assert margin < NEAR_TIE, f"prompt {i} left the reference at token {first}, where its margin was {margin:.2f}"
    drift = (teacher_forced(engine, prompts, want_all) - reference["forced"]).abs()
    assert drift.mean().item() < MEAN_DRIFT and drift.quantile(0.9).item() < P90_DRIFT, drift
    alone = run_to_completion(engine, {0: [("alone", prompts[2], greedy)]})["alone"]
    assert token_ids(alone) == token_ids(outs["r2"])  # the same tokens without batch-mates
    assert_no_leaks(engine)


def test_a_small_grouped_checkpoint_is_served_in_its_own_bits_on_the_cpu(tmp_path: Path) -> None:
    """tests/engine_helpers.save_grouped_model's checkpoint (what tests/test_engine_cuda.py serves on a GPU): on the CPU
    every projection and the tied head stay grouped (the C kernel, or torch where it cannot build; never the Triton
    path), and the tokens are the float32 copy's, whose log-probabilities they keep within the activations' rounding."""
    from transformers import LlamaConfig

    tiny = LlamaConfig(vocab_size=256, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
                       num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True,
                       initializer_range=0.1)
    save_grouped_model(tiny, tmp_path / "grouped", tmp_path / "dense")
    prompts, params = [[5, 9, 11, 40], [7, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    tokens, forced = {}, {}
    for name in ("dense", "grouped"):
        engine = LLMEngine(EngineConfig(model=str(tmp_path / name), packed_copy=False))
        outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
        tokens[name] = [token_ids(outs[f"r{i}"]) for i in range(len(prompts))]
        forced[name] = teacher_forced(engine, prompts, tokens["dense"])
    model = engine.runner.model
    linears = [m for m in model.modules() if isinstance(m, GgufLinear)]
    assert len(linears) == 2 * 4 + 1 and isinstance(model.embed_tokens, GgufEmbedding)
    assert all(m.mode == ("torch" if build_py.c_gemms_unavailable() else "wg8a8") for m in linears)
    assert tokens["grouped"] == tokens["dense"]
    assert (forced["grouped"] - forced["dense"]).abs().max().item() < 0.1  # measured 0.045 with the C kernel


def test_where_grouped_weights_stay_grouped() -> None:
    """One process on a CPU (the C kernel) or a CUDA GPU (the Triton GEMM): grouped; sharded or elsewhere: float32."""
    from backend.model.weights import grouped_kernel_runs

    assert [grouped_kernel_runs(d, parallel=False) for d in ("cpu", "cuda", "cuda:1", "mps")] == [True, True, True, False]
    assert not any(grouped_kernel_runs(d, parallel=True) for d in ("cpu", "cuda"))


NEON = "aarch64-linux-gnu-gcc", "qemu-aarch64"


@pytest.mark.skipif(any(shutil.which(t) is None for t in NEON) or build_py.is_arm(),
                    reason="the aarch64 cross compiler or qemu-aarch64 is absent (`make system-deps` installs them)")
@requires_c_kernels
@pytest.mark.parametrize(("group", "zeros", "offset", "half", "fifth"),
                         [(16, False, None, False, False), (32, True, None, False, False), (32, False, None, True, False),
                          (32, False, 8, True, False), (32, True, 0, False, False), (32, False, 16, True, True),
                          (32, True, 0, False, True)],
                         ids=["g16", "g32-terms", "g32-fp16-scales", "nibbles-q4_0", "nibbles-q4_k", "five-q5_0", "five-q5_k"])
def test_the_neon_kernel_gives_the_x86_kernels_bits(lib: object, group: int, zeros: bool, offset: int | None, half: bool,
                                                    fifth: bool, tmp_path: Path) -> None:
    """wg8a8_neon.c, cross-compiled with tests/c/wg8a8_harness.c and run under qemu-aarch64: the same bits as the x86
    kernels (the same integer sums and fp32 steps per lane), in the int8, the nibble and the 5-bit layout, with float32
    or fp16 scales, and each row the same computed alone."""
    root = Path(__file__).resolve().parents[1]
    exe = tmp_path / "wg8a8_harness"
    flags = [f for f in build_py.NEON_FLAGS if f not in {"-shared", "-fPIC"}]
    cmd = [NEON[0], *flags, "-static", "-Wall", "-Wextra", "-Werror", f"-I{root / 'kernels' / 'cpu'}",
           str(root / "tests" / "c" / "wg8a8_harness.c"), str(root / "kernels" / "cpu" / "wg8a8_neon.c"), "-o", str(exe)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    torch.manual_seed(group)
    m, n, k = 5, 40, 256
    nibbles = offset is not None
    low, high = (-128, 128) if offset is None else (-offset, (32 if fifth else 16) - offset)
    scales = torch.rand(n, k // group) * 0.01
    g = GroupedInt8(torch.randint(low, high, (n, k), dtype=torch.int8), scales.half().float() if half else scales,
                    torch.randn(n, k // 32) * 0.01 if zeros else None)
    w, x = pack(g, nibbles=nibbles, offset=offset or 0, fifth=fifth), torch.randn(m, k)
    assert (w.scales.dtype == torch.float16) == half

    def neon(rows: torch.Tensor, threads: int) -> torch.Tensor:
        (tmp_path / "x").write_bytes(rows.contiguous().numpy().tobytes())
        (tmp_path / "w").write_bytes(w.q.numpy().tobytes())
        (tmp_path / "ws").write_bytes(w.scales.numpy().tobytes())
        if w.zeros is not None:
            (tmp_path / "wz").write_bytes(w.zeros.numpy().tobytes())
        if w.fifth is not None:
            (tmp_path / "hi").write_bytes(w.fifth.numpy().tobytes())
        args = [str(tmp_path), str(len(rows)), str(n), str(k), str(group), str(int(zeros)), str(threads), str(int(nibbles)),
                str(offset or 0), str(int(half)), str(int(fifth))]
        run = subprocess.run(["qemu-aarch64", "-cpu", "max", str(exe), *args], capture_output=True, timeout=120)
        assert run.returncode == 0, run.stderr
        return torch.frombuffer(bytearray((tmp_path / "y").read_bytes()), dtype=torch.float32).view(len(rows), n)

    together = neon(x, 3)
    assert torch.equal(together, wg8a8_linear(lib, x, pack(g, lanes_of(lib))))  # type: ignore[arg-type]
    assert torch.equal(torch.cat([neon(x[i:i + 1], 1) for i in range(m)]), together)


@requires_c_kernels
def test_a_cpu_engine_never_imports_triton(gguf: Path) -> None:
    """Importing triton holds ~70 MB resident (its library) that a CPU never uses: the engine on a GGUF in its own bits
    (and the default model) loads and decodes without it (the GPU layouts import it where they are built)."""
    code = ("import sys; from backend.config import EngineConfig; from backend.engine.llm_engine import LLMEngine; "
            "from backend.engine.sampling_params import SamplingParams; "
            f"e = LLMEngine(EngineConfig(model={str(gguf)!r})); e.add_request('r', [2, 818], SamplingParams(max_tokens=2)); "
            "[e.step() for _ in range(4)]; LLMEngine(EngineConfig()); "
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('triton.')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"
