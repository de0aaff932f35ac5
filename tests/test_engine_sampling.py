"""Sampling parameters, stop conditions, logprobs, n>1, aborts and bad input, on the real model."""

from __future__ import annotations

import math

import pytest

from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.errors import ContextLengthError, InvalidRequestError
from tests.engine_helpers import assert_no_leaks, chat_ids, make_engine, run_to_completion, text, token_ids

PROMPT = "Write a short story about a dragon."


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return make_engine()


@pytest.fixture(autouse=True)
def no_leaks(engine: LLMEngine):
    yield
    assert_no_leaks(engine)


def generate(engine: LLMEngine, params: SamplingParams, prompt: str = PROMPT, rid: str = "r") -> list:
    return run_to_completion(engine, {0: [(rid, chat_ids(prompt), params)]})[rid]


def test_seed_gives_same_text_whatever_the_batch(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=20, seed=1234)
    alone = token_ids(generate(engine, params))
    unseeded = SamplingParams(temperature=1.0, max_tokens=20)
    others = [(f"o{i}", chat_ids(f"Question {i}: what is {i}+{i}?"), unseeded) for i in range(5)]
    batched = run_to_completion(engine, {0: [*others, ("s", chat_ids(PROMPT), params)]})
    assert token_ids(batched["s"]) == alone
    assert token_ids(generate(engine, SamplingParams(temperature=1.0, max_tokens=20, seed=99))) != alone


def test_n_siblings_share_prompt_blocks_and_differ(engine: LLMEngine) -> None:
    hits_before = engine.kv.hits
    outs = generate(engine, SamplingParams(n=3, temperature=1.0, max_tokens=16, seed=7))
    texts = [text(outs, i) for i in range(3)]
    assert len(set(texts)) > 1, "siblings with different seeds should not all agree"
    assert outs[-1].usage.completion_tokens == sum(len(token_ids(outs, i)) for i in range(3))
    assert engine.kv.hits - hits_before >= 2 * 16, "siblings 2 and 3 should reuse the first one's prompt blocks"
    finals = [d for o in outs for d in o.deltas if d.finish_reason]
    assert sorted(d.index for d in finals) == [0, 1, 2], "exactly one finish_reason per choice"


def test_max_tokens_and_length_finish(engine: LLMEngine) -> None:
    outs = generate(engine, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(token_ids(outs)) == 5
    assert outs[-1].deltas[-1].finish_reason == "length"


def test_stop_string_is_never_emitted(engine: LLMEngine) -> None:
    full = text(generate(engine, SamplingParams(temperature=0, max_tokens=40)))
    stop = full.split()[3]  # a word the model will produce
    outs = generate(engine, SamplingParams(temperature=0, max_tokens=40, stop=(stop,)))
    got = text(outs)
    assert stop not in got and full.startswith(got)
    assert outs[-1].deltas[-1].finish_reason == "stop" and outs[-1].deltas[-1].stop_reason == stop
    keep = SamplingParams(temperature=0, max_tokens=40, stop=(stop,), include_stop_str_in_output=True)
    with_stop = text(generate(engine, keep))
    assert with_stop == got + stop


def test_stop_token_ids_and_min_tokens(engine: LLMEngine) -> None:
    ids = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)))
    outs = generate(engine, SamplingParams(temperature=0, max_tokens=10, stop_token_ids=(ids[2],)))
    assert token_ids(outs) == ids[:3] and outs[-1].deltas[-1].stop_reason == ids[2]
    eos = engine.eos_token_id
    short = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=30), prompt="Say only: yes"))
    assert short[-1] == eos and len(short) < 30
    at_least = SamplingParams(temperature=0, max_tokens=30, min_tokens=len(short) + 3)
    forced = token_ids(generate(engine, at_least, prompt="Say only: yes"))
    assert eos not in forced[: len(short) + 3]


def test_logit_bias_forces_and_bans(engine: LLMEngine) -> None:
    target = engine.tokenizer.encode(" banana", add_special_tokens=False)[0]
    biased = SamplingParams(temperature=0, max_tokens=4, logit_bias={target: 100.0}, ignore_eos=True)
    forced = token_ids(generate(engine, biased))
    assert forced == [target] * 4
    greedy = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=4)))
    banned = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=4, logit_bias={greedy[0]: -100.0})))
    assert banned[0] != greedy[0]


def test_penalties_reduce_repetition(engine: LLMEngine) -> None:
    plain = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)))
    penalised = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, frequency_penalty=2.0)))
    repeated = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.5)))
    assert len(set(penalised)) > len(set(plain)) and len(set(repeated)) > len(set(plain))


def test_top_k_one_and_tiny_top_p_are_greedy(engine: LLMEngine) -> None:
    greedy = token_ids(generate(engine, SamplingParams(temperature=0, max_tokens=12)))
    assert token_ids(generate(engine, SamplingParams(temperature=1.5, top_k=1, max_tokens=12))) == greedy
    assert token_ids(generate(engine, SamplingParams(temperature=1.5, top_p=1e-6, max_tokens=12))) == greedy
    assert token_ids(generate(engine, SamplingParams(temperature=1.5, min_p=1.0, max_tokens=12))) == greedy


def test_logprobs_are_consistent(engine: LLMEngine) -> None:
    outs = generate(engine, SamplingParams(temperature=0, max_tokens=6, logprobs=3))
    lps = [lp for o in outs for d in o.deltas for lp in (d.logprobs or ())]
    assert len(lps) == 6
    for lp in lps:
        assert lp.top[0][0] == lp.token_id, "greedy picks the most likely token"
        assert math.isclose(lp.top[0][2], lp.logprob, rel_tol=1e-5) and lp.logprob <= 0
        assert [t[2] for t in lp.top] == sorted((t[2] for t in lp.top), reverse=True)


def test_abort_frees_blocks(engine: LLMEngine) -> None:
    engine.add_request("a", chat_ids(PROMPT), SamplingParams(max_tokens=100))
    for _ in range(3):
        engine.step()
    assert engine.kv.pool.num_free < engine.kv.pool.num_blocks
    final = engine.abort("a")
    assert final is not None and final.finished and final.deltas[0].finish_reason == "abort"


@pytest.mark.parametrize(
    ("prompt", "params", "error"),
    [
        ([], SamplingParams(), InvalidRequestError),
        ([10**7], SamplingParams(), InvalidRequestError),
        ([1, 2, 3], SamplingParams(max_tokens=10**6), ContextLengthError),
        ([1] * 9000, SamplingParams(max_tokens=1), ContextLengthError),
        ([1, 2, 3], SamplingParams(logit_bias={10**7: 1.0}), InvalidRequestError),
    ],
)
def test_bad_requests_raise_typed_errors(engine: LLMEngine, prompt: list[int], params: SamplingParams, error: type) -> None:
    with pytest.raises(error):
        engine.add_request("bad", prompt, params)


@pytest.mark.parametrize(
    "kwargs", [{"temperature": -1}, {"top_p": 0}, {"n": 0}, {"max_tokens": 0}, {"logprobs": 50}, {"presence_penalty": 3}]
)
def test_invalid_sampling_values(kwargs: dict) -> None:
    with pytest.raises(InvalidRequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == next(iter(kwargs))


def test_prompt_logprobs_from_lets_the_prefix_cache_serve_the_head(engine: LLMEngine) -> None:
    """The cache verifier's request: a prompt whose head the prefix cache holds, plus an answer to score. With
    `prompt_logprobs_from` at the answer, the head comes from the cache (not recomputed) and the answer's logprobs
    are those of a full prefill."""
    head = chat_ids("Name three colours.", system="You are a terse assistant who answers in one line.")
    answer = token_ids(run_to_completion(engine, {0: [("a", head, SamplingParams(temperature=0, max_tokens=24))]})["a"])
    full = [*head, *answer]
    score = lambda rid, **kw: run_to_completion(  # noqa: E731
        engine, {0: [(rid, full, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1, **kw))]}
    )[rid][0].prompt_logprobs
    reference = score("all")  # every position computed: no prefix-cache hit
    hits = engine.kv.hits
    tail = score("tail", prompt_logprobs_from=len(head))
    assert engine.kv.hits - hits >= engine.kv.block_size  # at least one block of the head came from the cache
    assert reference is not None and tail is not None and len(tail) == len(reference) == len(full)
    assert all(lp is None for lp in tail[: len(head)])
    for got, ref in zip(tail[len(head) :], reference[len(head) :], strict=True):
        assert got is not None and ref is not None and got.token_id == ref.token_id
        assert abs(got.logprob - ref.logprob) < 1e-4


def test_prompt_logprobs_match_a_full_forward(engine: LLMEngine) -> None:
    """Echo + logprobs: each prompt token's logprob, computed even across chunked prefill."""
    import torch

    from tests.engine_helpers import hf_model

    prompt = chat_ids("Name three colours.")
    engine.scheduler.max_num_batched_tokens = 8  # force a chunked prefill
    try:
        outs = generate(engine, SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=2), prompt="Name three colours.")
    finally:
        engine.scheduler.max_num_batched_tokens = engine.config.max_num_batched_tokens
    assert outs[0].prompt_token_ids == tuple(prompt)
    lps = outs[0].prompt_logprobs
    assert lps is not None and len(lps) == len(prompt) and lps[0] is None
    with torch.inference_mode():
        ref = torch.log_softmax(hf_model()(torch.tensor([prompt])).logits[0].float(), dim=-1)
    for pos in (1, len(prompt) // 2, len(prompt) - 1):
        assert lps[pos] is not None and lps[pos].token_id == prompt[pos]
        assert abs(lps[pos].logprob - float(ref[pos - 1, prompt[pos]])) < 1e-3
