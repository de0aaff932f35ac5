"""Tensor parallelism on CPU: 2 processes over gloo give the single-process engine's greedy tokens and logprobs.

Rank 0 runs the engine on its half of every layer and broadcasts each batch; rank 1 runs backend.parallel.driver's
worker loop on the other half (backend/parallel/local_group.py). Small random Llama (tied embeddings) and Qwen2
(q/k/v biases) checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, Qwen2Config

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.tensor_parallel import shard_config
from backend.parallel.local_group import run_ranks
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

SMALL = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)
CONFIGS = {"llama": LlamaConfig(**SMALL, tie_word_embeddings=True), "qwen2": Qwen2Config(**SMALL, tie_word_embeddings=False)}
PROMPTS = [[(i * 37 + j * 11) % 500 + 2 for j in range(n)] for i, n in enumerate((5, 19, 40))]
PARAMS = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=1)


def engine_config(model_dir: str, tp: int) -> EngineConfig:
    return EngineConfig(model=model_dir, tensor_parallel_size=tp, kv_cache_memory_mb=4, max_num_batched_tokens=13,
                        num_threads=1)


def generate(engine: LLMEngine) -> dict[str, tuple[list[int], list[float]]]:
    outs = run_to_completion(engine, {0: [(f"r{i}", p, PARAMS) for i, p in enumerate(PROMPTS)]})
    assert_no_leaks(engine)
    return {rid: (token_ids(o), [lp.logprob for x in o for d in x.deltas for lp in d.logprobs or ()]) for rid, o in outs.items()}


@pytest.mark.parametrize("family", list(CONFIGS))
def test_two_ranks_equal_one_process(family: str, tmp_path: Path) -> None:
    save_random_model(CONFIGS[family], tmp_path)
    expected = generate(LLMEngine(engine_config(str(tmp_path), 1)))
    got = run_ranks(2, engine_config(str(tmp_path), 2), generate)
    for rid, (tokens, logprobs) in expected.items():
        assert got[rid][0] == tokens, f"{family}: {rid} diverged"
        torch.testing.assert_close(torch.tensor(got[rid][1]), torch.tensor(logprobs), atol=1e-4, rtol=1e-4)


def test_shard_config_needs_divisible_heads() -> None:
    shard = shard_config(CONFIGS["llama"], 2)
    assert (shard.num_attention_heads, shard.num_key_value_heads, shard.intermediate_size, shard.head_dim) == (2, 1, 64, 16)
    with pytest.raises(ValueError, match="must divide"):
        shard_config(CONFIGS["llama"], 3)


def test_tensor_parallel_needs_a_process_group(tmp_path: Path) -> None:
    save_random_model(CONFIGS["llama"], tmp_path)
    with pytest.raises(ValueError, match="launch with torchrun"):
        LLMEngine(engine_config(str(tmp_path), 2))
