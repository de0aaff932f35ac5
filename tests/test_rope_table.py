"""The rope tables on a CPU grow as positions are first served (backend/model/rope.py): the rows computed on demand
equal the whole table computed at once, bit for bit; rows past what was served are not computed; a cast or a move
computes every row first; and the engine covers every position it serves (greedy tokens equal HF's across many chunk
boundaries)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, PretrainedConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.rope import RotaryEmbedding, inverse_frequencies
from tests.engine_helpers import hf_greedy, run_to_completion, save_random_model, token_ids

POSITIONS = 5000
LLAMA3 = LlamaConfig(head_dim=64, rope_parameters={
    "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 1024})
CASES = [(Gemma3TextConfig(), 256, "sliding_attention"), (Gemma3TextConfig(), 256, "full_attention"), (LLAMA3, 64, None)]


def whole(config: PretrainedConfig, dim: int, layer_type: str | None) -> torch.Tensor:
    """The table as it was computed before it was lazy: every position at once."""
    inv_freq, scaling = inverse_frequencies(config, dim, layer_type)
    freqs = torch.outer(torch.arange(POSITIONS, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos() * scaling, freqs.sin() * scaling), dim=-1)


@pytest.mark.parametrize(("config", "dim", "layer_type"), CASES)
def test_rows_computed_on_demand_equal_the_whole_table(config: PretrainedConfig, dim: int, layer_type: str | None) -> None:
    rope = RotaryEmbedding(config, dim, POSITIONS, layer_type)
    assert rope.filled == 0  # nothing computed (nor resident) before a position is served
    rope.cover(5)
    assert rope.cos_sin.shape == (RotaryEmbedding.CHUNK, dim)  # a whole chunk, no more
    grown = []
    for end in (1024, 1025, 3000, 2999, POSITIONS):
        rope.cover(end)
        grown.append(rope.filled)
    assert grown == [1024, 2048, 4096, 4096, POSITIONS]  # at least doubling, never past max_positions
    assert torch.equal(rope.cos_sin, whole(config, dim, layer_type))


def test_a_table_on_a_gpu_device_is_whole_from_the_start() -> None:
    """(The meta device stands in for a GPU here: anything but the CPU gets every row at once, as a CUDA graph holds
    the table's address.)"""
    rope = RotaryEmbedding(Gemma3TextConfig(), 256, POSITIONS, "full_attention", device="meta")
    assert rope.cos_sin.shape == (POSITIONS, 256) and rope.filled == rope.max_positions


def test_a_cast_or_a_move_computes_every_row_first() -> None:
    config = Gemma3TextConfig()
    rope = RotaryEmbedding(config, 256, POSITIONS, "full_attention")
    rope.cover(3)
    table = rope.cos_sin
    same = rope.to("cpu")  # a no-op: still partial
    assert same.filled == RotaryEmbedding.CHUNK and same.cos_sin is table
    cast = rope.to(torch.bfloat16)
    assert torch.equal(cast.cos_sin, whole(config, 256, "full_attention").bfloat16())
    cast.cover(POSITIONS)  # a copy is whole: nothing left to compute
    assert cast.filled == POSITIONS and cast.cos_sin.dtype == torch.bfloat16
    moved = RotaryEmbedding(config, 256, POSITIONS, "full_attention")
    moved.cover(3)
    moved.to("meta")  # a move to another device (the meta device stands in for a GPU): every row first
    assert moved.filled == POSITIONS and moved.cos_sin.device.type == "meta"


def test_the_engine_covers_every_position_it_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 16 rows: prompts of up to 100 tokens and their answers cross the table's growth four times, in prefill
    chunks and decode steps; the tokens are HF's, and the tables hold fewer than twice the longest context's rows."""
    from tests.test_model_families import CONFIGS, NORM_STD

    monkeypatch.setattr(RotaryEmbedding, "CHUNK", 16)
    hf = save_random_model(CONFIGS["gemma3"], tmp_path, NORM_STD["gemma3"])
    engine = LLMEngine(EngineConfig(model=str(tmp_path), max_num_batched_tokens=40, kv_cache_memory_mb=4))
    prompts = [[(i * 29 + j * 7) % 500 + 2 for j in range(n)] for i, n in enumerate((9, 70, 100))]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            assert token_ids(outs[f"r{i}"]) == hf_greedy(prompt, 20, hf), f"prompt {i} diverged"
    longest = 100 + 20 - 1  # the last token sampled is not run through the model
    for rope in engine.runner.model.ropes:
        assert longest <= rope.filled < 2 * longest and rope.filled < rope.max_positions
