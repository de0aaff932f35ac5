"""Greedy output must equal HF transformers' reference token for token, however we batch."""

from __future__ import annotations

import pytest

from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import QUESTIONS, assert_no_leaks, chat_ids, make_engine, run_to_completion, token_ids

MAX_NEW = 24
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
SYSTEM = "You are a concise assistant. Answer in one short paragraph and never use lists."


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    # Half share a long system prompt (prefix-cache hits), half use the template's default.
    return [chat_ids(q, SYSTEM if i % 2 else None) for i, q in enumerate(QUESTIONS[:20])]


def test_alone_matches_hf(prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = make_engine()
    for i, prompt in enumerate(prompts):
        outs = run_to_completion(engine, {0: [(f"r{i}", prompt, GREEDY)]})
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert engine.kv.hits > 0, "the shared system prompt should have hit the prefix cache"
    assert_no_leaks(engine)


@pytest.mark.parametrize("budget", [512, 24], ids=["whole-prefill", "chunked-prefill"])
def test_staggered_batch_matches_hf(prompts: list[list[int]], reference: list[list[int]], budget: int) -> None:
    """16 requests of different lengths arriving at different steps, mixed with running decodes."""
    engine = make_engine(max_num_batched_tokens=budget)
    arrivals: dict[int, list[tuple]] = {}
    for i in range(16):
        arrivals.setdefault((i * 3) % 11, []).append((f"r{i}", prompts[i], GREEDY))
    outs = run_to_completion(engine, arrivals)
    for i in range(16):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert_no_leaks(engine)


def test_preemption_keeps_outputs_exact(prompts: list[list[int]], reference: list[list[int]]) -> None:
    """A KV pool far too small for the batch forces preemption and recomputation."""
    engine = make_engine(kv_cache_memory_mb=12)  # 17 blocks of 16 tokens for 8 sequences of ~60 tokens
    outs = run_to_completion(engine, {0: [(f"r{i}", prompts[i], GREEDY) for i in range(8)]})
    assert engine.scheduler.num_preemptions > 0
    for i in range(8):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    assert_no_leaks(engine)
