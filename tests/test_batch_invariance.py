"""On the C kernels an INT4 (W4A8) model's greedy decoding is batch-invariant to the bit: a request computes the
same log-probabilities whether it runs alone, is chunked into long prefill chunks next to batch-mates, or reuses
prefix-cached blocks, or is verified as a speculative draft token. Every op is row-independent there, and every
prefill token attends through the paged decode kernel as one decode query (`per_token_prefill`), as does every row of
a verified draft, so no token's arithmetic depends on the chunk computing it.
Log-probabilities are compared token by token: a speculating step emits its accepted draft tokens and the target's
own in one delta, so how tokens are grouped into deltas depends on what was accepted when, not their values.
A tiny random Llama quantized with AWQ (group 64: the W4A8 kernel's). Skipped where the C kernels cannot build."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.quant.awq import quantize_model
from tests.c_kernels import requires_c_kernels
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

pytestmark = requires_c_kernels

CONFIG = LlamaConfig(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=4, max_position_embeddings=512, tie_word_embeddings=True,
)
SHARED = [(11 * j) % 500 + 2 for j in range(64)]  # a 64-token prefix every prompt starts with: 4 cacheable blocks
PROMPTS = [SHARED + [(7 * j + 3 * i) % 500 + 2 for j in range(30 + 25 * i)] for i in range(4)]
PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def awq(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch_invariance")
    save_random_model(CONFIG, root / "fp")
    calib = torch.randint(2, 512, (4, 64), generator=torch.Generator().manual_seed(0))
    quantize_model(root / "fp", root / "awq", group_size=64, calibration=calib, progress=False)
    return root / "awq"


def engine(model: Path, **overrides: object) -> LLMEngine:
    return LLMEngine(EngineConfig(**{"model": str(model), "kv_cache_memory_mb": 8, **overrides}))  # type: ignore[arg-type]


def results(e: LLMEngine, arrivals: dict[int, list[tuple]]) -> dict[str, tuple[list[int], list]]:
    """Per request: its token ids and each token's log-probabilities (the chosen token's and the top 3)."""
    outs = run_to_completion(e, arrivals)
    assert_no_leaks(e)
    return {rid: (token_ids(o), [lp for out in o for d in out.deltas for lp in d.logprobs]) for rid, o in outs.items()}


def alone(e: LLMEngine) -> dict[str, tuple[list[int], list]]:
    """Each request alone, one after the other."""
    out: dict[str, tuple[list[int], list]] = {}
    for i, p in enumerate(PROMPTS):
        out |= results(e, {0: [(f"r{i}", p, PARAMS)]})
    return out


@pytest.fixture(scope="module")
def reference(awq: Path) -> dict[str, tuple[list[int], list]]:
    """Plain decoding, each request alone, one prefill chunk, nothing cached."""
    return alone(engine(awq, enable_prefix_caching=False, max_num_batched_tokens=512, num_speculative_tokens=0))


@pytest.mark.parametrize("speculation", [0, 4], ids=["plain", "speculating"])
def test_alone_batched_chunked_and_prefix_cached_runs_agree_to_the_bit(
    awq: Path, reference: dict[str, tuple[list[int], list]], speculation: int
) -> None:
    """The batched runs decode plainly, or speculate (drafts of several sequences verified in one step, next to
    prefill chunks): either way every token's log-probabilities equal those of plain decoding alone."""
    # staggered batch-mates, 40-token prefill chunks next to decodes, the shared prefix cached after the first
    e = engine(awq, max_num_batched_tokens=40, num_speculative_tokens=speculation)
    batched = results(e, {2 * i: [(f"r{i}", p, PARAMS)] for i, p in enumerate(PROMPTS)})
    assert e.runner.per_token and e.stats().prefix_cache_hits > 0
    # the same again on a warm prefix cache: whole prompts but their last block come from the cache
    rerun = results(e, {0: [(f"r{i}", p, PARAMS) for i, p in enumerate(PROMPTS)]})
    assert reference == batched == rerun  # token ids and every top-3 log-probability, exactly
    assert (e.speculator.stats.accepted > 0) == bool(speculation)


def test_speculating_alone_agrees_to_the_bit_with_plain_decoding(
    awq: Path, reference: dict[str, tuple[list[int], list]]
) -> None:
    e = engine(awq, enable_prefix_caching=False, num_speculative_tokens=4)
    assert alone(e) == reference
    assert e.speculator.stats.accepted > 0


def test_per_token_prefill_only_where_the_c_decode_kernel_attends(awq: Path) -> None:
    assert engine(awq).runner.per_token
    assert not engine(awq, kernel_backend="torch").runner.per_token
