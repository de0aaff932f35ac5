"""Speculation with every sampling parameter: penalties, min_tokens, logit_bias, grammars, stop strings, logprobs.

The processors run per draft position (backend/spec/prefix.py), so greedy output, text, finish
reasons and logprobs must equal plain decoding's, with n-gram drafts and with the draft model.
"""

from __future__ import annotations

import json

import pytest

from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import assert_no_leaks, chat_ids, make_engine, rtn_int4_model, run_to_completion, text, token_ids

TEXT = "The sea is calm. The sea is blue. The sea is deep, and the sea is wide, and the sea is old."
SCHEMA = json.dumps({
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
})


def cases(engine: LLMEngine) -> dict[str, tuple[list[int], SamplingParams]]:
    copy = chat_ids(f"Repeat this text exactly:\n{TEXT}")
    sea = engine.tokenizer.encode(" sea", add_special_tokens=False)[0]
    greedy = {"temperature": 0, "max_tokens": 28}
    return {
        "penalties": (copy, SamplingParams(**greedy, presence_penalty=0.4, frequency_penalty=0.3, repetition_penalty=1.1)),
        "logit_bias+logprobs": (copy, SamplingParams(**greedy, logit_bias={sea: 2.5}, logprobs=2)),
        "min_tokens": (chat_ids("Say yes."), SamplingParams(temperature=0, max_tokens=24, min_tokens=12)),
        "stop_string": (copy, SamplingParams(**greedy, stop=("blue",), include_stop_str_in_output=True)),
        "grammar": (chat_ids("Give the city and population of Paris as JSON."), SamplingParams(**greedy, guided_json=SCHEMA)),
    }


def run(engine: LLMEngine) -> dict[str, tuple]:
    todo = cases(engine)
    outs = run_to_completion(engine, {0: [(name, ids, params) for name, (ids, params) in todo.items()]})
    result = {}
    for name in todo:
        last = outs[name][-1].deltas[-1]
        lps = [(lp.token_id, round(lp.logprob, 3)) for o in outs[name] for d in o.deltas for lp in (d.logprobs or ())]
        result[name] = (token_ids(outs[name]), text(outs[name]), last.finish_reason, lps)
    assert_no_leaks(engine)
    return result


@pytest.fixture(scope="module")
def plain() -> dict[str, tuple]:
    return run(make_engine(num_speculative_tokens=0))


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculation_with_every_sampling_parameter_is_exact(plain: dict[str, tuple], method: str) -> None:
    # all five requests speculate from their first decode step (the default max batch would wait for the tail)
    draft = {"speculative_model": str(rtn_int4_model())} if method == "draft" else {}  # make test has no AWQ copy
    engine = make_engine(num_speculative_tokens=4, speculative_method=method, speculative_max_batch=len(plain),
                         speculative_row_cost=0.0, **draft)
    if method == "draft":
        engine.speculator.draft_model.min_confidence = 0.0
    spec = run(engine)
    for name, expected in plain.items():
        tokens, out_text, finish, lps = spec[name]
        assert (tokens, out_text, finish) == expected[:3], name
        assert [t for t, _ in lps] == [t for t, _ in expected[3]]
        assert all(abs(a - b) < 2e-3 for (_, a), (_, b) in zip(lps, expected[3], strict=True)), name
    assert json.loads(spec["grammar"][1])["city"]
    assert spec["stop_string"][1].endswith("blue") and spec["stop_string"][2] == "stop"
    assert engine.speculator.stats.accepted > 0
