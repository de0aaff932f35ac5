"""The decode stack (every decoder layer of a decode step in one C call, backend/model/decode_stack.py) against the
layer-by-layer path over the same kernels: the same log-probabilities to the bit and the same greedy tokens,
through staggered arrivals, chunked prefill and preemption; and where it applies. A tiny random Llama quantized
with AWQ (group 64: the W4A8 kernel's), and Gemma 3's GGUF in its own blocks (the grouped W8A8 kernel's four layouts,
QK-norm, sandwich norms, GeGLU, two rope tables, sliding-window layers in a K/V pool of their own or not). Skipped where
the C kernels cannot be built."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.fetch import fetch_gemma_gguf
from backend.model.decode_stack import DecodeStack
from backend.model.forward_batch import ForwardBatch, LayerCaches
from backend.quant.awq import quantize_model
from tests.c_kernels import requires_c_kernels
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

pytestmark = requires_c_kernels

CONFIG = LlamaConfig(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True,
)  # 4 KB of fp32 K/V a token: the ~760 tokens in flight preempt in a 1 MB cache, bf16 too
PROMPTS = [[(7 * j + 3 * i) % 500 + 2 for j in range(40 + 24 * i)] for i in range(5)]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(full-precision, AWQ) directories of the same random model."""
    root = tmp_path_factory.mktemp("decode_stack")
    src, out = root / "fp", root / "awq"
    save_random_model(CONFIG, src)
    calib = torch.randint(2, 512, (4, 64), generator=torch.Generator().manual_seed(0))
    quantize_model(src, out, group_size=64, calibration=calib, progress=False)
    return src, out


def engine(model: Path, stack: bool, **overrides: object) -> LLMEngine:
    e = LLMEngine(EngineConfig(**{"model": str(model), "kv_cache_memory_mb": 4, **overrides}))  # type: ignore[arg-type]
    if not stack:
        e.runner.model.decode_stack = None  # the reference: layer by layer
    return e


def test_applies_to_w4a8_models_on_the_c_kernels_only(checkpoints: tuple[Path, Path]) -> None:
    fp, awq = checkpoints
    assert isinstance(engine(awq, stack=True).runner.model.decode_stack, DecodeStack)
    assert engine(awq, stack=True, kernel_backend="torch").runner.model.decode_stack is None
    assert engine(awq, stack=True, int4_cpu_kernel="torch").runner.model.decode_stack is None
    assert engine(fp, stack=True).runner.model.decode_stack is None


@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "overrides",
    # speculation (on by default) emits several tokens a step, which leaves the 1 MB cache enough room: the preempted
    # case turns it off to keep preempting; the plain case runs verified drafts through the stack too
    [{}, {"max_num_batched_tokens": 16, "kv_cache_memory_mb": 1, "num_speculative_tokens": 0}],
    ids=["plain", "chunked+preempted"],
)
def test_same_logprobs_and_tokens_as_layer_by_layer(
    checkpoints: tuple[Path, Path], kv_cache_dtype: str, overrides: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    call = DecodeStack.__call__
    monkeypatch.setattr(DecodeStack, "__call__", lambda self, x, *a: calls.append(x.shape[0]) or call(self, x, *a))
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=3)
    arrivals = {i: [(f"r{i}", p, params)] for i, p in enumerate(PROMPTS)}  # staggered: mixed and pure decode steps
    results = []
    for stack in (True, False):
        e = engine(checkpoints[1], stack, kv_cache_dtype=kv_cache_dtype, **overrides)
        outs = run_to_completion(e, arrivals)
        assert_no_leaks(e)
        if overrides:
            assert e.scheduler.num_preemptions > 0
        per_token = {rid: [lp for out in o for d in out.deltas for lp in d.logprobs] for rid, o in outs.items()}
        results.append({rid: (token_ids(o), per_token[rid]) for rid, o in outs.items()})
    assert results[0] == results[1]  # token ids and every top-3 log-probability, exactly
    assert len(results[0]) == len(PROMPTS) and max(calls) > 1  # the stack ran, batched decodes included


@pytest.mark.parametrize("kv_window_pool", [True, False], ids=["window_pool", "one_pool"])
@pytest.mark.parametrize("kv_cache_dtype", ["float32", "bfloat16"])
def test_gemma_in_its_own_bits_same_logprobs_and_tokens_as_layer_by_layer(
    kv_window_pool: bool, kv_cache_dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Contexts past the 512-token window, so the windowed layers read only their window while the global ones read
    everything; with a pool of their own small enough (169 blocks) that the second wave reuses its freed blocks,
    so its block tables and slots are no longer the full layers' (checked: the stack must read the windowed view)."""
    gguf = fetch_gemma_gguf()
    calls: list[int] = []
    diverged: list[bool] = []
    call = DecodeStack.__call__

    def spy(self: DecodeStack, x: torch.Tensor, ropes: list[torch.Tensor], batch: ForwardBatch, kv: LayerCaches):
        calls.append(x.shape[0])
        if batch.windowed is not None:
            assert batch.windowed.decode is not None and batch.decode is not None
            diverged.append(not torch.equal(batch.windowed.slot_mapping, batch.slot_mapping))
        return call(self, x, ropes, batch, kv)

    monkeypatch.setattr(DecodeStack, "__call__", spy)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)
    text = [2] + [(37 * j) % 5000 + 100 for j in range(890)]
    arrivals = {0: [("a", text, params), ("b", [3, *text[100:700]], params)],
                8: [("c", [4, *text[:700]], params), ("d", [5] * 640, params)]}
    results = []
    for stack in (True, False):
        mb = 48 if kv_cache_dtype == "bfloat16" else 96  # the same blocks either way
        e = engine(gguf, stack, kv_cache_dtype=kv_cache_dtype, kv_window_pool=kv_window_pool, kv_cache_memory_mb=mb,
                   max_num_seqs=4, num_speculative_tokens=0)
        if stack:
            assert isinstance(e.runner.model.decode_stack, DecodeStack)
            assert isinstance(e.runner.layer_caches, list) == kv_window_pool
        outs = run_to_completion(e, arrivals)
        per_token = {rid: [lp for out in o for d in out.deltas for lp in d.logprobs] for rid, o in outs.items()}
        results.append({rid: (token_ids(o), per_token[rid]) for rid, o in outs.items()})
    assert results[0] == results[1]  # token ids and every top-3 log-probability, exactly
    assert len(results[0]) == 4 and max(calls) > 1  # the stack ran, batched decodes included
    assert any(diverged) == kv_window_pool
