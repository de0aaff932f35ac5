"""The CUDA-graph decode path's bookkeeping (backend/engine/cuda_graphs.py), on a CPU.

No GPU here: the Triton kernels run in Triton's interpreter, and `capture_graph` is replaced by an eager stand-in
that, like a graph, reads the static inputs and writes the static output on every replay. So the padding, the
static buffers, the fixed-width block tables and the choice of which steps replay are checked; the capture itself
runs in tests/test_engine_cuda.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine import cuda_graphs
from backend.engine.cuda_graphs import DecodeGraphs, graph_batch_sizes
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

TINY = LlamaConfig(
    vocab_size=256, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=6, num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True,
)
MAX_SEQS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama-graphs")
    save_random_model(TINY, path)
    return path


def eager_capture(forward: Callable[[], torch.Tensor], pool: object) -> tuple[Callable[[], None], torch.Tensor]:
    output = forward()

    def replay() -> None:
        output.copy_(forward())

    return replay, output


def engine(model_dir: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=str(model_dir), kernel_backend="triton", block_size=4, max_num_batched_tokens=16,
        max_num_seqs=MAX_SEQS, num_speculative_tokens=0,
    ))


def with_graphs(eng: LLMEngine) -> DecodeGraphs:
    runner = eng.runner
    runner.graphs = DecodeGraphs(runner.model, runner.kv_cache, eng.kv, MAX_SEQS, max_model_len=eng.max_model_len)
    runner.graphs.capture()
    return runner.graphs


def test_batch_sizes() -> None:
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(3) == [1, 2, 3]
    assert graph_batch_sizes(1) == [1]
    assert graph_batch_sizes(10_000)[-1] == cuda_graphs.MAX_GRAPH_BATCH


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the engine captures graphs (tests/test_engine_cuda.py)")
def test_graphs_are_off_on_a_cpu(model_dir: Path) -> None:
    eng = engine(model_dir)  # cuda_graphs defaults to true: without CUDA it does nothing
    assert eng.config.cuda_graphs and eng.runner.graphs is None
    assert eng.runner.graph_stats.captured == [] and eng.runner.graph_stats.replays == {}


def test_replayed_decode_steps_match_eager(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_graphs, "capture_graph", eager_capture)
    prompts = [[7, 9, 11, 13, 15, 17, 19, 21, 3], [5, 6], [40, 41, 42, 43, 44, 45, 46], [8, 1, 2]]
    params = SamplingParams(temperature=0, max_tokens=9, ignore_eos=True, logprobs=1)
    arrivals = {0: [("a", prompts[0], params), ("b", prompts[1], params)], 4: [("c", prompts[2], params)],
                6: [("d", prompts[3], params)], 7: [("e", prompts[1], params)]}  # e: 5 sequences > MAX_SEQS, it waits
    runs = {}
    for graphs in (False, True):
        eng = engine(model_dir)
        stats = with_graphs(eng).stats if graphs else None
        runs[graphs] = run_to_completion(eng, arrivals)
        assert_no_leaks(eng)
        if stats is not None:
            assert stats.error is None and stats.captured == [1, 2, 4]
            used = {size for size, n in stats.replays.items() if n > 0}
            assert len(used) > 1, stats  # several padded sizes (padding rows exercised at 3 -> 4)
    for rid in "abcde":
        assert token_ids(runs[True][rid]) == token_ids(runs[False][rid]), rid
        lp = {g: [lp.logprob for o in runs[g][rid] for d in o.deltas for lp in d.logprobs or ()] for g in runs}
        torch.testing.assert_close(torch.tensor(lp[True]), torch.tensor(lp[False]), atol=1e-4, rtol=1e-4)


def test_only_pure_decode_steps_replay(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_graphs, "capture_graph", eager_capture)
    eng = engine(model_dir)
    graphs = with_graphs(eng)
    eng.add_request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    with torch.inference_mode():  # as LLMEngine.step runs
        out = eng.scheduler.schedule()  # the prefill: eager
        assert graphs.size_for(out) is None
        eng.postprocess(out, eng.runner.run(out))
        out = eng.scheduler.schedule()  # a decode of one sequence
        assert graphs.size_for(out) == 1
        eng.postprocess(out, eng.runner.run(out))
        assert graphs.stats.replays[1] == 1
        eng.add_request("b", [9, 10], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
        out = eng.scheduler.schedule()  # a decode and a prefill: eager
        assert out.prefills and out.decodes and graphs.size_for(out) is None


def test_capture_failure_runs_eagerly(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                      caplog: pytest.LogCaptureFixture) -> None:
    def broken(forward: Callable[[], torch.Tensor], pool: object) -> tuple[Callable[[], None], torch.Tensor]:
        raise RuntimeError("capture not permitted")

    monkeypatch.setattr(cuda_graphs, "capture_graph", broken)
    eng = engine(model_dir)
    graphs = with_graphs(eng)
    assert graphs.stats.error == "RuntimeError: capture not permitted" and graphs.stats.captured == []
    assert "capture not permitted" in caplog.text
    outs = run_to_completion(eng, {0: [("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))]})
    assert len(token_ids(outs["a"])) == 4
    assert sum(graphs.stats.replays.values()) == 0
    assert_no_leaks(eng)
