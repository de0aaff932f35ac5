"""The shipped GGUF's 4-bit blocks served as they are (backend/quant/gguf_blocks.py, `quantization: auto`).

What holds, and is checked here:
- the blocks are the reference's weights: dequantized (d q + m in fp32, llama.cpp's arithmetic) every projection,
  and every other tensor, equals the full-precision copy (the same GGUF dequantized by transformers) bit for bit;
  Q4_0 and Q4_1 blocks decode as gguf-py decodes them;
- Int4Linear's gguf layout computes with those values (W4A8 kernel, torch's int4 kernel), and a cast of the model to
  bf16 leaves them alone;
- the served model (C kernels: W4A8 projections with int8 activations per group of 32, W8A8 lm_head, bf16 KV cache)
  against the reference's greedy output: the activations' int8 rounding moves log-probabilities a little (as
  llama.cpp's own Q8_1 activations do), so greedy output cannot equal the fp32 reference's token for token
  everywhere; it may leave it only at a near tie (the reference's two best tokens within NEAR_TIE), and the
  reference's tokens keep their log-probabilities within a stated tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.weights import read_hf_tensors
from backend.quant.gguf_blocks import dequantize_blocks, pack_q4, q4_blocks, unpack_q4
from backend.quant.int4_linear import Int4Linear, dequantized_weight
from tests.c_kernels import requires_c_kernels
from tests.engine_helpers import (
    QUESTIONS,
    chat_ids,
    gguf_int4_model,
    model_path,
    run_to_completion,
    teacher_forced,
    token_ids,
)

MAX_NEW = 32
NEAR_TIE = 0.75  # nats between the reference's best two tokens; the largest gap a flip was seen at: 0.34
MEAN_DRIFT, P90_DRIFT = 0.15, 0.4  # |log p| of the reference's tokens, served vs reference; measured 0.08 / 0.21


@pytest.fixture(scope="module")
def blocks_dir() -> Path:
    return gguf_int4_model()


def test_the_blocks_are_the_reference_weights(blocks_dir: Path) -> None:
    blocks, ref = read_hf_tensors(blocks_dir), read_hf_tensors(model_path())
    served = {k.removesuffix(".q4") for k in blocks if k.endswith(".q4")}
    assert len(served) == 30 * 7  # every projection of the 30 layers is a Q4_1 block tensor
    for name, weight in ref.items():
        stem = name.removesuffix(".weight")
        if stem in served:
            got = dequantize_blocks(unpack_q4(blocks[f"{stem}.q4"]), blocks[f"{stem}.q4_scales"], blocks[f"{stem}.q4_mins"])
        else:
            got = blocks[name]  # the Q8_0 embedding table, the norms
        assert torch.equal(got, weight), name


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_blocks_decode_as_gguf_py_does(kind: str) -> None:
    from gguf import GGMLQuantizationType, dequantize, quantize

    qtype = GGMLQuantizationType[kind]
    w = np.random.default_rng(0).standard_normal((6, 128)).astype(np.float32) * 0.05
    raw = quantize(w, qtype)  # (6, bytes): blocks of 32 along each row
    q, d, m = q4_blocks(raw, kind == "Q4_0")
    assert q.shape == (6, 128) and d.shape == m.shape == (6, 4) and int(q.max()) <= 15
    assert torch.equal(dequantize_blocks(q, d, m), torch.from_numpy(dequantize(raw, qtype)))
    assert torch.equal(unpack_q4(pack_q4(q)), q)


def gguf_layer(out: int, k: int, seed: int = 0) -> tuple[Int4Linear, torch.Tensor]:
    """An Int4Linear in the gguf layout holding random Q4_1 blocks, as the loader fills it, and the blocks' minimums."""
    g = torch.Generator().manual_seed(seed)
    layer = Int4Linear(k, out, 32, bias=False, layout="gguf")
    q = torch.randint(0, 16, (out, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(out, k // 32, generator=g) * 0.01 + 1e-3).half()
    m = (-torch.rand(out, k // 32, generator=g) * 0.08).half()
    layer.q4.data, layer.q4_scales.data, layer.q4_mins.data = pack_q4(q), d.view(torch.int16), m.view(torch.int16)
    return layer, m.float()


@requires_c_kernels
@pytest.mark.parametrize("rows", [1, 7, 40])
def test_gguf_layer_on_the_w4a8_kernel(rows: int) -> None:
    from backend.quant.convert import w4a8_kernel

    layer, mins = gguf_layer(96, 256)
    weight = dequantized_weight(layer)
    layer.prepare(w4a8=w4a8_kernel("w4a8"))
    assert layer.mode == "w4a8" and layer.w4a8.group_size == 32
    assert torch.equal(layer.w4a8.zeros_t, -mins.T)  # the zero term is -m as stored: no integer zero point
    assert layer.w4a8.blocks and layer.weight_bytes() == 96 * 256 // 64 * 40  # fp16 d and -m inline: 5 bits a weight
    x = torch.randn(rows, 256)
    ref = x @ weight.T
    assert ((layer(x) - ref).norm() / ref.norm()).item() < 0.02  # int8 activations per group of 32


def test_gguf_layer_on_torch_s_int4_kernel_and_a_bf16_cast() -> None:
    layer, _ = gguf_layer(64, 128, seed=1)
    weight = dequantized_weight(layer)
    layer.to(torch.bfloat16)  # the loader casts the model; the blocks' fp16 scales are held as int16 and survive
    assert torch.equal(dequantized_weight(layer), weight)
    layer.prepare(dense_copy=False)
    assert layer.mode == "int4pack"
    x = torch.randn(3, 128)
    ref = x @ weight.T
    assert ((layer(x).float() - ref).norm() / ref.norm()).item() < 0.02  # bf16 activations, scales and minimums


@dataclass(frozen=True)
class Reference:
    prompts: list[list[int]]
    tokens: list[list[int]]  # greedy continuations (the full-precision engine's equal HF's: test_engine_greedy)
    margins: list[list[float]]  # per step, the log-probability gap between its best two tokens
    forced: torch.Tensor  # the log-probability of each of those tokens, all continuations concatenated


@pytest.fixture(scope="module")
def reference() -> Reference:
    prompts = [chat_ids(q) for q in QUESTIONS[:6]]
    engine = LLMEngine(EngineConfig(quantization="none"))
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    tokens = [token_ids(outs[f"r{i}"]) for i in range(len(prompts))]
    margins = [[lp.top[0][2] - lp.top[1][2] for o in outs[f"r{i}"] for d in o.deltas for lp in d.logprobs]
               for i in range(len(prompts))]
    return Reference(prompts, tokens, margins, teacher_forced(engine, prompts, tokens))


@requires_c_kernels
def test_served_blocks_leave_the_reference_only_at_near_ties(blocks_dir: Path, reference: Reference) -> None:
    engine = LLMEngine(EngineConfig(model=str(blocks_dir)))  # the defaults: W4A8, W8A8 head, bf16 KV cache
    assert {m.mode for m in engine.runner.model.modules() if isinstance(m, Int4Linear)} == {"w4a8"}
    greedy = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, greedy) for i, p in enumerate(reference.prompts)]})
    for i, want in enumerate(reference.tokens):
        got = token_ids(outs[f"r{i}"])
        first = next((j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        margin = reference.margins[i][first] if first is not None else 0.0
        assert margin < NEAR_TIE, f"prompt {i} left the reference at token {first}, where its margin was {margin:.2f}"
    # the reference's own tokens, fed as a prompt: how far the served model's log-probabilities drift from it
    drift = (teacher_forced(engine, reference.prompts, reference.tokens) - reference.forced).abs()
    assert drift.mean().item() < MEAN_DRIFT and drift.quantile(0.9).item() < P90_DRIFT, drift


@requires_c_kernels
def test_served_blocks_score_an_answer_the_same_over_a_cached_prefix(blocks_dir: Path) -> None:
    """The cache verifier on the default 4-bit path: an answer's log-probabilities with `prompt_logprobs_from` (the
    prefix cache serving the prompt) equal those of a prefill that computes every position."""
    engine = LLMEngine(EngineConfig(model=str(blocks_dir)))
    head = chat_ids("Name three colours.")
    answer = token_ids(run_to_completion(engine, {0: [("a", head, SamplingParams(temperature=0, max_tokens=24))]})["a"])
    full = [*head, *answer]
    score = lambda rid, **kw: run_to_completion(  # noqa: E731
        engine, {0: [(rid, full, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1, **kw))]}
    )[rid][0].prompt_logprobs
    reference = score("all")
    hits = engine.kv.hits
    tail = score("tail", prompt_logprobs_from=len(head))
    assert engine.kv.hits - hits >= engine.kv.block_size
    assert reference is not None and tail is not None
    for got, ref in zip(tail[len(head) :], reference[len(head) :], strict=True):
        assert got is not None and ref is not None and got.token_id == ref.token_id and got.top == ref.top
        assert abs(got.logprob - ref.logprob) < 1e-3
