"""N-gram / reference-text speculation: greedy output stays token-identical, sampling keeps its distribution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.spec.ngram import propose_ngram
from backend.spec.policy import NGRAM, REFERENCE, AdaptivePolicy, SeqSpecState, best_k
from tests.c_kernels import requires_c_kernels
from tests.engine_helpers import (
    QUESTIONS,
    assert_no_leaks,
    check_mixed_speculation,
    make_engine,
    run_to_completion,
    save_random_model,
    token_ids,
)

TEXT = (
    "The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away into the "
    "forest, where it met an old owl who told it stories about the moon and the stars."
)
PROMPTS = [f"Repeat the following text exactly:\n{TEXT}", *QUESTIONS[:7]]
MAX_NEW = 40


def test_ngram_proposer() -> None:
    assert propose_ngram([1, 2, 3, 9, 1, 2], k=3) == [3, 9, 1]  # longest suffix [1, 2] seen before
    assert propose_ngram([5, 6, 7], k=2) == []
    assert propose_ngram([4, 5], k=2, reference=[9, 5, 8, 7]) == [8, 7]  # the reference is searched too
    assert propose_ngram([1, 2, 3, 1], k=5, max_n=1) == [2, 3, 1]
    assert propose_ngram([4, 5, 4], k=2, reference=[9, 5, 8, 7], search_self=False) == []  # the reference only


CONSTRAINED = {"max_num_batched_tokens": 20, "kv_cache_memory_mb": 16}
FORCED = {"num_speculative_tokens": 4, "speculative_row_cost": 0.0}  # every sequence drafts 4 tokens every step
ADAPTIVE: dict = {}  # the default configuration: speculation on, the adaptive policy


@pytest.mark.parametrize(
    "overrides", [FORCED, {**FORCED, **CONSTRAINED}, ADAPTIVE, {**ADAPTIVE, **CONSTRAINED}],
    ids=["forced", "forced-chunked+preempted", "default", "default-chunked+preempted"],
)
def test_greedy_speculation_is_exact(prompts: list[list[int]], reference: list[list[int]], overrides: dict) -> None:
    """Forced: every draft is 4 tokens (the most rollbacks). Default: the adaptive policy of EngineConfig's defaults,
    sequences speculating or not step by step as their acceptance and the batch size say."""
    engine = make_engine(**overrides)
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)
    arrivals = {i: [(f"r{i}", p, params)] for i, p in enumerate(prompts)}
    outs = run_to_completion(engine, arrivals)
    for i in range(len(prompts)):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    stats = engine.speculator.stats
    assert stats.accepted > 0 and stats.proposed > stats.accepted
    assert_no_leaks(engine)


def test_default_policy_mixed_with_opted_out_and_preempted(prompts: list[list[int]], reference: list[list[int]]) -> None:
    """The default configuration (the adaptive policy), staggered arrivals, every other request not speculating, a KV
    budget small enough to preempt: every output equals HF's greedy one."""
    check_mixed_speculation(make_engine(**ADAPTIVE, **CONSTRAINED), prompts, reference, MAX_NEW, preempts=True)


def test_policy_k_follows_acceptance_and_batch_size() -> None:
    """A token is drafted while its chance of acceptance (alpha**i) pays for its row at this batch size."""
    assert best_k(0.9, 4, row_cost=0.4, batch=1) == 4  # 0.9**4 = 0.66 > 0.4
    assert best_k(0.6, 4, row_cost=0.4, batch=1) == 1  # 0.6 > 0.4 > 0.36
    assert best_k(0.3, 4, row_cost=0.4, batch=1) == 0
    assert best_k(0.9, 4, row_cost=0.4, batch=8) == 1  # a token costs 0.475 of a one-sequence step at 8 streams
    assert best_k(0.95, 4, row_cost=0.4, batch=32) == 0  # ... and 0.42 at 32: only near-certain drafts pay
    assert best_k(0.999, 4, row_cost=0.4, batch=32) == 4
    assert best_k(0.1, 4, row_cost=0.0, batch=64) == 4  # row cost 0: always the longest draft


def test_policy_stops_a_failing_source_and_probes_with_backoff() -> None:
    policy = AdaptivePolicy(max_k=4, row_cost=0.4, max_batch=8)
    state = SeqSpecState()
    assert policy.plan(state, [NGRAM], batch=1) == [(NGRAM, 1)]  # the prior: one token, lengthened when accepted
    policy.proposed(state)
    policy.verified(state, NGRAM, proposed=1, accepted=1)
    assert policy.plan(state, [NGRAM], batch=1)[0][1] > 1
    for _ in range(3):  # rejected drafts: alpha falls below what pays
        policy.proposed(state)
        policy.verified(state, NGRAM, proposed=2, accepted=0)
    waits = []
    for _ in range(3):  # it stops; probes one token after 8 idle steps, then 16, then 32 (each probe rejected)
        steps = 1
        while not policy.plan(state, [NGRAM], batch=1):
            steps += 1
        waits.append(steps)
        policy.proposed(state)
        policy.verified(state, NGRAM, proposed=1, accepted=0)
    assert waits == [8, 16, 32]
    assert policy.plan(state, [REFERENCE, NGRAM], batch=1) == [(REFERENCE, 4)]  # another source keeps its own estimate
    assert policy.plan(state, [REFERENCE], batch=9) == []  # above speculative_max_batch


@requires_c_kernels
def test_verified_rows_have_plain_decodings_logprobs_to_the_bit(prompts: list[list[int]]) -> None:
    """On the C kernels a verify attends each draft position as a plain decode step would (the paged decode kernel,
    row by row) and a row's GEMM result does not depend on its batch-mates (kernels/cpu/small_gemm.c): the emitted
    tokens' log-probabilities equal plain decoding's exactly, not just the tokens."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    logprobs = []
    for k in (0, 4):
        engine = make_engine(num_speculative_tokens=k)
        outs = run_to_completion(engine, {0: [("r", prompts[0], params)]})
        logprobs.append([lp for o in outs["r"] for d in o.deltas for lp in d.logprobs or ()])
    assert engine.speculator.stats.accepted > 0 and len(logprobs[0]) == 24
    assert logprobs[0] == logprobs[1]


def test_reference_text_drafts_are_mostly_accepted(prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = make_engine(num_speculative_tokens=6)
    answer = engine.tokenizer.decode(reference[1])  # e.g. a near-miss cached answer from the gateway
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, spec_reference=answer)
    outs = run_to_completion(engine, {0: [("r", prompts[1], params)]})
    assert token_ids(outs["r"]) == reference[1]
    stats = engine.speculator.stats
    assert stats.accepted >= 0.8 * stats.proposed and stats.accepted >= MAX_NEW // 2
    steps_saved = stats.accepted
    assert steps_saved > 0
    off = run_to_completion(engine, {0: [("s", prompts[1], SamplingParams(temperature=0, max_tokens=8, speculate=False))]})
    assert token_ids(off["s"]) == reference[1][:8] and engine.speculator.stats.proposed == stats.proposed
    assert_no_leaks(engine)


TINY = LlamaConfig(
    vocab_size=32, hidden_size=64, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
)


def second_token_distribution(engine: LLMEngine, prompt: list[int], n: int, reference: str | None) -> torch.Tensor:
    """Empirical P(second token); reference=None turns speculation off for these requests."""
    spec = {"spec_reference": reference, "speculate": reference is not None}
    params = [SamplingParams(temperature=1.0, max_tokens=3, ignore_eos=True, seed=s, **spec) for s in range(n)]
    outs = run_to_completion(engine, {0: [(f"r{s}", prompt, p) for s, p in enumerate(params)]})
    seconds = torch.tensor([token_ids(outs[f"r{s}"])[1] for s in range(n)])
    return torch.bincount(seconds, minlength=TINY.vocab_size).float() / n


def test_sampled_speculation_keeps_the_target_distribution(tmp_path: Path) -> None:
    """Rejection sampling must reproduce P(second token) exactly; compare both paths with the exact value."""
    hf = save_random_model(TINY, tmp_path)
    with torch.no_grad():
        hf.lm_head.weight.mul_(8.0)  # a peaked distribution, so a wrong acceptance rule shows
    hf.save_pretrained(tmp_path)
    prompt = [3, 5, 7]
    with torch.inference_mode():
        p1 = torch.softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
        both = torch.tensor([[*prompt, t] for t in range(TINY.vocab_size)])
        p2_given = torch.softmax(hf(both).logits[:, -1], -1)
    exact = p1 @ p2_given  # P(second token)
    every_token = " ".join(f"w{i}" for i in range(TINY.vocab_size))  # any last token finds a draft here
    engine = LLMEngine(EngineConfig(model=str(tmp_path), num_speculative_tokens=3, speculative_max_batch=10**6,
                                    speculative_row_cost=0.0,
                                    max_num_seqs=256, max_num_batched_tokens=2048, max_waiting=10**5))
    n = 4000
    spec = second_token_distribution(engine, prompt, n, every_token)
    assert engine.speculator.stats.proposed >= n // 2 and 0 < engine.speculator.stats.accepted < engine.speculator.stats.proposed
    plain = second_token_distribution(engine, prompt, n, None)
    tv_spec, tv_plain = (0.5 * (d - exact).abs().sum().item() for d in (spec, plain))
    assert tv_spec < 0.05 and tv_plain < 0.05, (tv_spec, tv_plain)
    assert_no_leaks(engine)
