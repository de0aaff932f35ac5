"""The engine's Triton path (kernels/, run by Triton's interpreter here) equals its torch path.

A tiny random Llama keeps the interpreter fast; the batch mixes decodes, chunked prefills and
prefix-cache hits so every kernel (KV store, flash prefill, paged decode, RMSNorm, rotary) runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from kernels.cpu.build import c_kernels_unavailable
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

TINY = LlamaConfig(
    vocab_size=256, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    save_random_model(TINY, path)
    return path


def engine(model_dir: Path, backend: str) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(model_dir), kernel_backend=backend, block_size=4, max_num_batched_tokens=9))


def test_triton_path_is_selected(model_dir: Path) -> None:
    assert engine(model_dir, "triton").runner.model.ops.name == "triton"
    cpu = "torch" if c_kernels_unavailable() else "cpu"  # the torch ops + the C paged decode kernel where it builds
    assert engine(model_dir, "auto").runner.model.ops.name == ("triton" if torch.cuda.is_available() else cpu)
    assert engine(model_dir, "torch").runner.model.ops.name == "torch"


def test_triton_logits_and_greedy_tokens_match_torch(model_dir: Path) -> None:
    shared = [7, 9, 11, 13, 15, 17, 19, 21]  # two full blocks: later requests hit the prefix cache
    prompts = [[*shared, 3], [5, 6], [*shared, 40, 41, 42, 43, 44, 45, 46]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    runs = {}
    for backend in ("torch", "triton"):
        eng = engine(model_dir, backend)
        arrivals = {0: [("a", prompts[0], params), ("b", prompts[1], params)], 3: [("c", prompts[2], params)]}
        runs[backend] = run_to_completion(eng, arrivals)
        assert eng.kv.hits > 0
        assert_no_leaks(eng)
    for rid in "abc":
        assert token_ids(runs["triton"][rid]) == token_ids(runs["torch"][rid]), rid
        lp_torch = [lp.logprob for o in runs["torch"][rid] for d in o.deltas for lp in d.logprobs or ()]
        lp_triton = [lp.logprob for o in runs["triton"][rid] for d in o.deltas for lp in d.logprobs or ()]
        torch.testing.assert_close(torch.tensor(lp_triton), torch.tensor(lp_torch), atol=1e-4, rtol=1e-4)


def family_config(family: str) -> object:
    from transformers import Gemma3TextConfig, Phi3Config

    if family == "gemma3":
        return Gemma3TextConfig(
            vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=6, max_position_embeddings=128,
            layer_types=["sliding_attention", "full_attention"],
        )
    return Phi3Config(  # Phi-4-mini's form: 12 of each head's 16 dims turn (96 of 128 in the real model)
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, partial_rotary_factor=0.75, tie_word_embeddings=True,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.2,
    )


@pytest.mark.parametrize("family", ["gemma3", "phi4-mini"])
def test_family_on_the_triton_path_matches_torch(family: str, tmp_path: Path) -> None:
    """Gemma 3's block (QK-norm through the RMSNorm kernel, two rope tables, a sliding layer) and Phi-4-mini's partial
    rotary (a width that is no power of two through the rotary kernel) on the Triton kernels."""
    save_random_model(family_config(family), tmp_path, norm_std=0.3 if family == "gemma3" else 0.0)
    prompts = [[2, *range(10, 22)], [2, 5, 6]]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    runs = {}
    for backend in ("torch", "triton"):
        eng = engine(tmp_path, backend)
        runs[backend] = run_to_completion(eng, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
        assert_no_leaks(eng)
    for rid in ("r0", "r1"):
        assert token_ids(runs["triton"][rid]) == token_ids(runs["torch"][rid]), rid
        lp = {b: [lp.logprob for o in runs[b][rid] for d in o.deltas for lp in d.logprobs or ()] for b in runs}
        torch.testing.assert_close(torch.tensor(lp["triton"]), torch.tensor(lp["torch"]), atol=1e-4, rtol=1e-4)
