"""Determinism of the default serving configuration's 4-bit path (docs/determinism.md): the real SmolLM2-135M with INT4
weights on the C kernels (W4A8 projections, W8A8 lm_head, paged decode attention, the bf16 KV cache `auto` picks) gives
every request the same tokens and the same log-probabilities, to the bit, cold or prefix-cached, alone or in a batch
of mixed prefill chunks and decodes, chunked or whole, preempted and recomputed, with or without speculation; greedy
and seeded (temperature 0.8, top_p 0.95).

Every test runs on two INT4 models: the default serving copy (the shipped GGUF's Q4_1 blocks, groups of 32) and, as
`make test` has no AWQ copy (`make test-models` fetches --copies auto,none), the full-precision weights quantized once
with round-to-nearest into the AWQ checkpoint format (group 64), kept on disk. Determinism is a property of the kernels
and the engine, not of the quantizer's quality: the AWQ search only changes the weights' values. Skipped where the C
kernels cannot build (the torch fallback is not batch-invariant, as the doc says)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.quant.int4_linear import Int4Linear
from tests.c_kernels import requires_c_kernels
from tests.engine_helpers import (
    QUESTIONS,
    assert_no_leaks,
    chat_ids,
    gguf_int4_model,
    rtn_int4_model,
    run_to_completion,
    token_ids,
)

pytestmark = requires_c_kernels

TARGETS = ["Describe the water cycle for a ten-year-old.", "What are three uses of copper?",
           "Explain what a compiler does."]
MAX_NEW = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
SEEDED = SamplingParams(temperature=0.8, top_p=0.95, seed=1234, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)
OTHER = SamplingParams(temperature=0, max_tokens=MAX_NEW + 6, ignore_eos=True)

Result = tuple[list[int], list[float]]  # token ids, the chosen tokens' log-probabilities


@pytest.fixture(scope="module", params=["gguf-q4_1-g32", "rtn-awq-g64"])
def int4_model(request: pytest.FixtureRequest) -> Path:
    return gguf_int4_model() if request.param.startswith("gguf") else rtn_int4_model()


def engine(model: Path, **overrides: object) -> LLMEngine:
    """The default configuration (EngineConfig's defaults: deterministic, C kernels, kv_cache_dtype auto)."""
    return LLMEngine(EngineConfig(**{"model": str(model), **overrides}))  # type: ignore[arg-type]


def results(e: LLMEngine, arrivals: dict[int, list[tuple]]) -> dict[str, Result]:
    outs = run_to_completion(e, arrivals)
    assert_no_leaks(e)
    return {rid: (token_ids(o), [lp.logprob for out in o for d in out.deltas for lp in d.logprobs or ()])
            for rid, o in outs.items()}


def targets() -> list[tuple[str, list[int], SamplingParams]]:
    """Every target prompt, greedy and seeded."""
    return [(f"{kind}{i}", chat_ids(q), params) for i, q in enumerate(TARGETS)
            for kind, params in (("g", GREEDY), ("s", SEEDED))]


def alone(e: LLMEngine, kinds: str = "gs") -> dict[str, Result]:
    """Each target (of `kinds`: g greedy, s seeded) on its own, one after the other."""
    out: dict[str, Result] = {}
    for rid, prompt, params in targets():
        if rid[0] in kinds:
            out |= results(e, {0: [(rid, prompt, params)]})
    return out


def mixed_batch() -> dict[int, list[tuple]]:
    """Twelve other requests arriving over the first steps, the targets among them: prefill chunks next to decodes."""
    arrivals: dict[int, list[tuple]] = {}
    for i, q in enumerate(QUESTIONS[:12]):
        arrivals.setdefault(i // 3, []).append((f"o{i}", chat_ids(q), OTHER))
    for j, request in enumerate(targets()):
        arrivals.setdefault(1 + j, []).append(request)
    return arrivals


def only_targets(res: dict[str, Result]) -> dict[str, Result]:
    return {rid: r for rid, r in res.items() if not rid.startswith("o")}


@pytest.fixture(scope="module")
def cold(int4_model: Path) -> LLMEngine:
    """No speculation: the other tests' engines speculate as the default configuration does."""
    return engine(int4_model, enable_prefix_caching=False, num_speculative_tokens=0)


@pytest.fixture(scope="module")
def reference(cold: LLMEngine) -> dict[str, Result]:
    """Each target alone, its prompt in one prefill chunk, nothing cached, no speculation."""
    return alone(cold)


def test_the_4bit_path_serves_every_row_on_row_invariant_kernels(int4_model: Path) -> None:
    e = engine(int4_model)
    model = e.runner.model
    assert {m.mode for m in model.modules() if isinstance(m, Int4Linear)} == {"w4a8"}
    assert model.lm_head.w8a8_lib is not None and e.runner.per_token and model.decode_stack is not None


def test_seeded_twice_alone(cold: LLMEngine, reference: dict[str, Result]) -> None:
    again = alone(cold, "s")
    assert again == {rid: r for rid, r in reference.items() if rid.startswith("s")}


def test_cold_and_prefix_cached_agree(int4_model: Path, reference: dict[str, Result]) -> None:
    e = engine(int4_model)
    # caches every prompt's full blocks (registered after the prefill step: a request finished by it registers none)
    results(e, {0: [(rid, p, SamplingParams(max_tokens=2)) for rid, p, _ in targets()]})
    cached = alone(e)
    assert e.stats().prefix_cache_hits >= 6 * 32
    assert cached == reference


def test_alone_and_in_a_mixed_chunked_batch_agree(int4_model: Path, reference: dict[str, Result]) -> None:
    """The targets arrive among twelve other requests; prompts prefill in chunks of at most 24 tokens next to
    decodes (and the shared chat-template prefix comes from the cache for later arrivals)."""
    e = engine(int4_model, max_num_batched_tokens=24)
    assert only_targets(results(e, mixed_batch())) == reference


def test_preempted_and_recomputed_agree(int4_model: Path, reference: dict[str, Result]) -> None:
    """A KV budget of 11 blocks for the six targets at once (4 blocks each by the end): sequences are preempted and
    recompute their prompt and output as a prefill chunk."""
    e = engine(int4_model, kv_cache_memory_mb=4, enable_prefix_caching=False)
    assert e.kv.pool.num_blocks == 11
    batch = results(e, {0: targets()})
    assert e.scheduler.num_preemptions > 0
    assert batch == reference


def test_speculative_verification_agrees(int4_model: Path, reference: dict[str, Result]) -> None:
    """n-gram speculation (3 tokens): verified rows give the logits plain decode steps give, and a seeded request's
    verification draws the tokens plain sampling draws (position-keyed noise)."""
    e = engine(int4_model, num_speculative_tokens=3, speculative_row_cost=0.0, enable_prefix_caching=False)
    assert alone(e) == reference
    assert 0 < e.speculator.stats.accepted < e.speculator.stats.proposed


def test_default_adaptive_speculation_agrees(int4_model: Path, reference: dict[str, Result]) -> None:
    """The default configuration's adaptive policy (speculating or not per sequence and step) against no speculation,
    greedy and seeded, alone and among other requests (most steps with more than speculative_max_batch running)."""
    e = engine(int4_model, enable_prefix_caching=False)
    assert alone(e) == reference
    assert e.speculator.stats.proposed > 0
    assert only_targets(results(e, mixed_batch())) == reference


def test_speculation_with_opted_out_and_preempted_agrees(int4_model: Path, reference: dict[str, Result]) -> None:
    """Speculation on (forced: 4-token drafts every step, the most rollbacks) in an 11-block KV cache: the six targets
    at once, every other one opting out (a step verifies drafts next to plain decode rows), sequences preempted
    with their drafts dropped and recomputed as prefill chunks."""
    e = engine(int4_model, kv_cache_memory_mb=4, enable_prefix_caching=False, num_speculative_tokens=4,
               speculative_row_cost=0.0)
    batch = [(rid, p, replace(params, speculate=j % 2 == 0)) for j, (rid, p, params) in enumerate(targets())]
    assert results(e, {0: batch}) == reference
    assert e.scheduler.num_preemptions > 0 and 0 < e.speculator.stats.accepted < e.speculator.stats.proposed
