"""Pipeline parallelism on CPU: 2 gloo processes (stage 0: layers 0-14, embeddings and lm_head; stage 1: layers
15-29) give the single-process engine's greedy tokens and logprobs for the real default model (SmolLM2-135M, full
precision), with chunked prefill and a prefix-cache hit in the same run."""

from __future__ import annotations

import pytest
import torch

from backend.config import EngineConfig, parse_args
from backend.engine.llm_engine import LLMEngine
from backend.engine.model_runner import kv_cache_shape
from backend.engine.sampling_params import SamplingParams
from backend.model.pipeline_parallel import stage_layers
from backend.model.ranks import parallel_ranks
from backend.model.weights import load_model
from backend.parallel.local_group import run_ranks
from tests.engine_helpers import QUESTIONS, assert_no_leaks, chat_ids, model_path, run_to_completion, token_ids

PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)


def engine_config(pp: int) -> EngineConfig:
    # 24 tokens a step: the ~35-token prompts prefill in chunks, next to other sequences' decodes
    return EngineConfig(quantization="none", pipeline_parallel_size=pp, kv_cache_memory_mb=16,
                        max_num_batched_tokens=24, num_threads=1)


def generate(engine: LLMEngine) -> dict[str, object]:
    """Three prompts in one batch, then the first again once its blocks are cached (a prefix-cache hit)."""
    prompts = [chat_ids(q) for q in QUESTIONS[:3]]
    arrivals = {0: [(f"r{i}", p, PARAMS) for i, p in enumerate(prompts)], 9: [("again", prompts[0], PARAMS)]}
    outs = run_to_completion(engine, arrivals)
    assert_no_leaks(engine)
    result: dict[str, object] = {
        rid: (token_ids(o), [lp.logprob for x in o for d in x.deltas for lp in d.logprobs or ()]) for rid, o in outs.items()
    }
    result["cache_hits"] = engine.kv.hits
    result["kv_cache_shape"] = tuple(engine.runner.kv_cache.shape)
    return result


def test_two_stages_equal_one_process() -> None:
    expected = generate(LLMEngine(engine_config(1)))
    got = run_ranks(2, engine_config(2), generate)
    assert got["cache_hits"] > 0 and got["cache_hits"] == expected["cache_hits"]
    # stage 0's cache holds its 15 layers' K/V; the same budget buys it (at least) twice the slots of the 30-layer cache
    assert got["kv_cache_shape"][0] == 15 and expected["kv_cache_shape"][0] == 30
    assert got["kv_cache_shape"][2] >= 2 * expected["kv_cache_shape"][2]
    for rid in ("r0", "r1", "r2", "again"):
        tokens, logprobs = expected[rid]
        assert got[rid][0] == tokens, f"{rid} diverged"
        # the same ops on the same shapes, only split across processes: equal, not just close
        torch.testing.assert_close(torch.tensor(got[rid][1]), torch.tensor(logprobs), atol=0, rtol=0)


def test_last_stage_holds_only_its_layers() -> None:
    full = load_model(model_path(), EngineConfig(device="cpu"), 64)
    stage = load_model(model_path(), EngineConfig(device="cpu"), 64, pp=(1, 2))
    assert stage.layer_ids == range(15, 30) and len(stage.layers) == 15
    assert stage.embed_tokens is None and stage.lm_head is None and stage.norm is None
    assert kv_cache_shape(stage, 4, 16) == (15, *kv_cache_shape(full, 4, 16)[1:])
    # our layer j is the checkpoint's layer 15 + j, every tensor of it
    torch.testing.assert_close(stage.layers.state_dict(), full.layers[15:].state_dict(), atol=0, rtol=0)
    params = sum(p.numel() for p in stage.parameters())
    assert params < 0.5 * sum(p.numel() for p in full.parameters())  # no embedding table (28M of 135M)


@pytest.mark.parametrize(("layers", "stages", "ranges"), [
    (30, 2, [range(0, 15), range(15, 30)]),
    (7, 3, [range(0, 3), range(3, 5), range(5, 7)]),
    (2, 2, [range(0, 1), range(1, 2)]),
])
def test_stage_layers_split_evenly(layers: int, stages: int, ranges: list[range]) -> None:
    assert [stage_layers(layers, stages, s) for s in range(stages)] == ranges


def test_bad_sizes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="pipeline_parallel_size 31 must be between 1 and the model's 30 decoder layers"):
        load_model(model_path(), EngineConfig(device="cpu"), 64, pp=(0, 31))
    with pytest.raises(ValueError, match="tp x pp is not supported"):
        parallel_ranks(2, 2)
    with pytest.raises(ValueError, match="must be >= 1"):
        parallel_ranks(1, 0)
    with pytest.raises(ValueError, match=r"pipeline_parallel_size 2 needs torch\.distributed initialised"):
        LLMEngine(engine_config(2))


def test_launcher_picks_the_kind() -> None:
    assert parse_args(["--port", "8000"]).parallel is None  # one process: no torch.distributed
    args = parse_args(["--parallel", "pipeline", "--port", "8000"])
    assert (args.parallel, args.port) == ("pipeline", 8000)
