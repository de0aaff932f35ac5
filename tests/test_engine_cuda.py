"""The engine on a CUDA GPU (compiled Triton kernels) equals HF transformers' greedy reference token for token.

Skipped without a GPU (CI has none). The model has SmolLM2-135M's shapes (30 layers, 9 query and 3 KV heads of
64, vocabulary 49,152) with random weights, so no download is needed; fp32, so the kernels' and cuBLAS's
summation orders stay far below the gaps between the two best logits. The batch mixes whole and chunked prefills,
staggered arrivals, prefix-cache hits and preemption: every Triton kernel and every path through the paged cache
runs. Pure-decode steps replay CUDA graphs (engine.cuda_graphs, on by default); the tests check that they did, at
several padded batch sizes, and that with the setting off none is captured.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SMOL_SHAPES = LlamaConfig(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, head_dim=64, max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True, initializer_range=0.1,  # wider than HF's 0.02: logits far from uniform
)
MAX_NEW = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
GRAPH_SIZES = [1, 2, 4, 8, 16, 32, 48, 64]  # graph_batch_sizes(max_num_seqs=64), the default


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("smol-shapes")
    save_random_model(SMOL_SHAPES, path)
    return path


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(2, 49152, (40,), generator=g).tolist()  # 2.5 blocks: later prompts hit the prefix cache
    out = []
    for i, n in enumerate((5, 17, 64, 130, 33, 250, 9, 71)):
        own = torch.randint(2, 49152, (n,), generator=g).tolist()
        out.append([*shared, *own] if i % 2 else own)
    return out


@pytest.fixture(scope="module")
def reference(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda").eval()
    out = []
    with torch.inference_mode():
        for p in prompts:
            ids = model.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=[], pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
    del model
    torch.cuda.empty_cache()
    return out


def engine(model_dir: Path, **overrides: object) -> LLMEngine:
    config = {"model": str(model_dir), "device": "cuda", "dtype": "float32", "num_speculative_tokens": 0, **overrides}
    return LLMEngine(EngineConfig(**config))  # type: ignore[arg-type]


def assert_graphs_replayed(eng: LLMEngine) -> None:
    """Every size captured, and pure-decode steps replayed at more than one of them. The staggered finishes make
    the decode batches shrink (as scheduled: whole prefill 8 -> 6, 5, 4, 3, 2, 1 sequences; chunked 8 -> 7, 6,
    5, 2, 1; preemption 5, 4, 3, 1), so several padded sizes run whatever the numerics."""
    stats = eng.runner.graph_stats
    assert stats.error is None, stats.error
    assert stats.captured == GRAPH_SIZES
    used = [size for size, n in stats.replays.items() if n > 0]
    assert len(used) > 1, stats


def test_cuda_runs_the_triton_kernels(model_dir: Path) -> None:
    eng = engine(model_dir)
    assert eng.device == "cuda"
    assert eng.runner.model.ops.name == "triton"
    assert eng.runner.graph_stats.captured == GRAPH_SIZES, eng.runner.graph_stats.error


@pytest.mark.parametrize("budget", [512, 48], ids=["whole-prefill", "chunked-prefill"])
def test_staggered_batch_matches_hf(model_dir: Path, prompts: list[list[int]], reference: list[list[int]],
                                    budget: int) -> None:
    eng = engine(model_dir, max_num_batched_tokens=budget)
    arrivals: dict[int, list[tuple]] = {}
    for i, p in enumerate(prompts):
        arrivals.setdefault((i * 3) % 7, []).append((f"r{i}", p, GREEDY))
    outs = run_to_completion(eng, arrivals)
    for i in range(len(prompts)):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert eng.kv.hits > 0, "the shared prefix should have hit the prefix cache"
    assert_graphs_replayed(eng)
    assert_no_leaks(eng)


def test_preemption_keeps_outputs_exact(model_dir: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    # 30 layers x 3 KV heads x 64 x 2 (K, V) x 4 bytes x 16 tokens = 0.70 MiB a block: 20 MiB holds 28 blocks,
    # the longest request needs 20 and all eight together 63
    eng = engine(model_dir, kv_cache_memory_mb=20)
    outs = run_to_completion(eng, {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]})
    assert eng.scheduler.num_preemptions > 0
    for i in range(len(prompts)):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert_graphs_replayed(eng)
    assert_no_leaks(eng)


def test_without_cuda_graphs_no_graph_runs(model_dir: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    eng = engine(model_dir, cuda_graphs=False)
    outs = run_to_completion(eng, {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]})
    for i in range(len(prompts)):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert eng.runner.graphs is None
    assert eng.runner.graph_stats.captured == [] and eng.runner.graph_stats.replays == {}
    assert_no_leaks(eng)


def test_speculation_keeps_outputs_exact(model_dir: Path, prompts: list[list[int]], reference: list[list[int]]) -> None:
    """n-gram drafts (always the longest), verified as extra rows by the Triton kernels."""
    eng = engine(model_dir, num_speculative_tokens=4, speculative_row_cost=0.0)
    outs = run_to_completion(eng, {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]})
    print("speculation:", eng.speculator.stats)
    for i in range(len(prompts)):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert_no_leaks(eng)


# Llama-3.2-1B's shapes (16 layers, 32 query and 8 KV heads of 64, vocabulary 128,256, llama3 rope scaling), random
# weights: the size where decode is bandwidth-bound, not launch-bound (bench.gpu measures it)
LLAMA_1B_SHAPES = LlamaConfig(
    vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
    num_key_value_heads=8, head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=True,
    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
    initializer_range=0.05,
)


@pytest.fixture(scope="module")
def model_1b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-1b-shapes")
    save_random_model(LLAMA_1B_SHAPES, path)
    return path


def test_llama_1b_shapes_match_hf_and_graphs_change_no_token(model_1b: Path, prompts: list[list[int]]) -> None:
    """fp32: the engine equals HF's greedy reference at 1B shapes through staggered batches, with CUDA graphs and
    without; bf16: the greedy tokens with graphs equal those without."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_1b, dtype=torch.float32).to("cuda").eval()
    with torch.inference_mode():
        ref = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=[],
                           pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    del hf
    torch.cuda.empty_cache()
    arrivals: dict[int, list[tuple]] = {}
    for i, p in enumerate(prompts):
        arrivals.setdefault((i * 3) % 7, []).append((f"r{i}", p, GREEDY))
    for graphs in (True, False):
        eng = engine(model_1b, cuda_graphs=graphs)
        outs = run_to_completion(eng, arrivals)
        assert [token_ids(outs[f"r{i}"]) for i in range(len(prompts))] == ref, f"cuda_graphs={graphs}"
        if graphs:
            assert_graphs_replayed(eng)
        assert_no_leaks(eng)
        del eng
    bf16 = []
    for graphs in (True, False):
        eng = engine(model_1b, dtype="bfloat16", cuda_graphs=graphs)
        outs = run_to_completion(eng, {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]})
        bf16.append([token_ids(outs[f"r{i}"]) for i in range(len(prompts))])
        del eng
    assert bf16[0] == bf16[1]


def test_gguf_grouped_weights_run_the_triton_gemm(tmp_path: Path, prompts: list[list[int]]) -> None:
    """A GGUF's grouped int8 weights on one GPU (tests/engine_helpers.save_grouped_model: groups of 16 and 32, with
    and without terms, the tied embedding too) stay grouped on the device and run kernels/triton/gguf_gemm.py: fp32
    greedy tokens equal those of the same values as float32 weights (cuBLAS), with CUDA graphs and without; bf16's
    graphs replay and repeat their tokens."""
    from backend.quant.gguf_linear import GgufEmbedding, GgufLinear
    from tests.engine_helpers import save_grouped_model

    save_grouped_model(SMOL_SHAPES, tmp_path / "grouped", tmp_path / "dense")
    arrivals = {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]}
    runs = {}
    for name in ("dense", "grouped"):
        eng = engine(tmp_path / name)
        outs = run_to_completion(eng, arrivals)
        runs[name] = [token_ids(outs[f"r{i}"]) for i in range(len(prompts))]
        if name == "grouped":
            model = eng.runner.model
            linears = [m for m in model.modules() if isinstance(m, GgufLinear)]
            assert len(linears) == 30 * 4 + 1 and all(m.mode == "triton" for m in linears)
            assert isinstance(model.embed_tokens, GgufEmbedding) and model.lm_head.weight_q is model.embed_tokens.weight_q
            assert all(m.weight_q.qt.device.type == "cuda" for m in linears)
            assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())  # no float copy of a projection
            assert_graphs_replayed(eng)
        assert_no_leaks(eng)
        del eng
    assert runs["grouped"] == runs["dense"]
    assert_grouped_graphs_hold(tmp_path / "grouped", arrivals, len(prompts), runs["grouped"])


def assert_grouped_graphs_hold(model_dir: Path, arrivals: dict, count: int, want: list[list[int]],
                               **overrides: object) -> None:
    """A grouped model's CUDA graphs: in fp32, eager steps give the graphs' tokens (`want`: the summation orders
    differ, far below the logit gaps); in bf16 the graphs replay and a second run repeats the first token for token.
    bf16 with graphs against bf16 without is not asserted: a padded decode batch and the graph's full-width block
    table change paged decode's split count, so its summation order (seen on an H200: 1 of 8 prompts diverged at
    its 7th token), which is why engine.cuda_graphs is part of the cache keys' model fingerprint."""
    eng = engine(model_dir, cuda_graphs=False, **overrides)
    outs = run_to_completion(eng, arrivals)
    assert [token_ids(outs[f"r{i}"]) for i in range(count)] == want
    del eng
    bf16 = []
    for _ in range(2):
        eng = engine(model_dir, dtype="bfloat16", **overrides)
        outs = run_to_completion(eng, arrivals)
        bf16.append([token_ids(outs[f"r{i}"]) for i in range(count)])
        stats = eng.runner.graph_stats
        assert stats.error is None and sum(stats.replays.values()) > 0, stats
        del eng
    assert bf16[0] == bf16[1]


@pytest.mark.parametrize("family", ["qwen2", "mistral", "qwen3", "gemma3", "phi3", "phi4-mini-partial-rotary",
                                    "llama3-rope-scaling"])
def test_each_family_matches_hf_on_cuda(family: str, tmp_path: Path) -> None:
    """tests/test_model_families.py's tiny checkpoints on the GPU (compiled Triton kernels, CUDA graphs, chunked
    prefill): Gemma 3's sliding layers (window 8) through the paged decode kernel's window, QK-norm through the RMSNorm
    kernel, Phi's fused layers and partial rotary, Llama 3's rope scaling: HF's fp32 greedy tokens on the same GPU."""
    from tests.test_model_families import CONFIGS, NORM_STD

    hf = save_random_model(CONFIGS[family], tmp_path, NORM_STD.get(family, 0.0)).to("cuda")
    eng = engine(tmp_path, max_num_batched_tokens=7, kv_cache_memory_mb=4, max_num_seqs=8)
    prompts = [[(i * 37 + j * 11) % 500 + 2 for j in range(n)] for i, n in enumerate((5, 19, 40, 64))]
    outs = run_to_completion(eng, {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts)]})
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            ref = hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False,
                              eos_token_id=[], pad_token_id=0)
            assert token_ids(outs[f"r{i}"]) == ref[0, len(p):].tolist(), f"{family}: prompt {i} diverged"
    stats = eng.runner.graph_stats
    assert stats.error is None and sum(stats.replays.values()) > 0, stats
    assert_no_leaks(eng)


GEMMA3_270M = dict(  # gemma-3-270m-q4_k_m.gguf's header (backend.quant.gguf_config), random weights
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, sliding_window=512, query_pre_attn_scalar=256, max_position_embeddings=32768,
    initializer_range=0.1,
)


def test_gemma3_270m_shapes_grouped_on_cuda_match_hf_past_the_window(tmp_path: Path) -> None:
    """Gemma 3 270M's shapes with GGUF-style grouped weights (the K-quant forms; the 262,144-row tied embedding too) on
    the GPU's Triton grouped GEMM: prompts past the 512-token sliding window, a shared prefix (prefix-cache hits),
    chunked prefill. fp32 greedy tokens and every prompt position's log-probability equal HF's on the same values as
    float32 weights, with CUDA graphs and without; bf16's graphs replay and repeat their tokens."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    from backend.quant.gguf_linear import GgufLinear
    from tests.engine_helpers import save_grouped_model

    save_grouped_model(Gemma3TextConfig(**GEMMA3_270M), tmp_path / "grouped", tmp_path / "dense")
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(2, 262144, (300,), generator=g).tolist()
    prompts = [[*shared, *torch.randint(2, 262144, (n,), generator=g).tolist()] for n in (250, 420, 9)]
    prompts.append(torch.randint(2, 262144, (700,), generator=g).tolist())
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "dense", dtype=torch.float32).to("cuda").eval()
    with torch.inference_mode():
        reference = [hf.generate(torch.tensor([p], device="cuda"), max_new_tokens=MAX_NEW, do_sample=False,
                                 eos_token_id=[], pad_token_id=0)[0, len(p):].tolist() for p in prompts]
        # every position's log-probability too (a random model's greedy tokens soon repeat one token)
        want = torch.log_softmax(hf(torch.tensor([prompts[3]], device="cuda")).logits[0].float(), dim=-1)
        want = [want[j - 1, t].item() for j, t in enumerate(prompts[3]) if j]
    del hf
    torch.cuda.empty_cache()
    arrivals = {0: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts[:2])],
                3: [(f"r{i}", p, GREEDY) for i, p in enumerate(prompts[2:], start=2)]}
    eng = engine(tmp_path / "grouped", max_num_batched_tokens=256, max_model_len=2048)
    outs = run_to_completion(eng, arrivals)
    assert [token_ids(outs[f"r{i}"]) for i in range(len(prompts))] == reference
    assert eng.kv.hits > 0
    scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    got = run_to_completion(eng, {0: [("lp", prompts[3], scored)]})["lp"][0].prompt_logprobs
    worst = max(abs(lp.logprob - w) for lp, w in zip(got[1:], want, strict=True))
    assert worst < 2e-3, f"prompt log-probabilities differ from HF's by up to {worst:.2e}"
    linears = [m for m in eng.runner.model.modules() if isinstance(m, GgufLinear)]
    assert len(linears) == 18 * 4 + 1 and all(m.mode == "triton" for m in linears)
    assert_no_leaks(eng)
    del eng
    assert_grouped_graphs_hold(tmp_path / "grouped", arrivals, len(prompts), reference, max_num_batched_tokens=256,
                               max_model_len=2048)
