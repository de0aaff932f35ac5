"""Legacy completions through the OpenAI SDK: every prompt form, echo, logprobs, streaming."""

from __future__ import annotations

import gateway_fixtures
import openai
import pytest
from gateway_fixtures import LiveStack, assert_completion_chunk, assert_schema

client = gateway_fixtures.client
live = gateway_fixtures.live

MODEL = "SmolLM2-135M-Instruct"


def test_string_prompt(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="The capital of France is", max_tokens=4
    )
    assert_schema("CreateCompletionResponse", raw.http_response.json())
    resp = raw.parse()
    assert resp.object == "text_completion" and resp.id.startswith("cmpl-")
    (choice,) = resp.choices
    assert choice.text and choice.finish_reason in ("stop", "length")
    assert 0 < resp.usage.completion_tokens <= 4


def test_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt="Once upon a time", extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 16


def test_list_of_strings_with_n(client: openai.OpenAI) -> None:
    resp = client.completions.create(model=MODEL, prompt=["One, two,", "Red, green,"], max_tokens=3, n=2)
    assert_schema("CreateCompletionResponse", resp.model_dump(exclude_unset=True))
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]


def test_token_id_prompts_match_string_prompt(client: openai.OpenAI, live: LiveStack) -> None:
    prompt = "The sky is"
    ids = live.engine.tokenize(prompt)
    by_text = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    many = client.completions.create(
        model=MODEL, prompt=[ids, live.engine.tokenize("Grass is")], max_tokens=2
    )
    assert len(many.choices) == 2


def test_echo_and_logprobs(client: openai.OpenAI) -> None:
    prompt = "Water is"
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, echo=True, temperature=0)
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    lp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, logprobs=2, temperature=0)
    assert_schema("CreateCompletionResponse", lp.model_dump(exclude_unset=True))
    logprobs = lp.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert all(len(top) <= 2 for top in logprobs.top_logprobs)
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(3)]
    both = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=3, logprobs=1, echo=True, temperature=0
    )
    both_lp = both.choices[0].logprobs
    assert both_lp.token_logprobs[0] is None  # the first prompt token has no logprob (as in OpenAI)
    assert len(both_lp.tokens) == both.usage.prompt_tokens + both.usage.completion_tokens
    assert "".join(both_lp.tokens) == both.choices[0].text
    assert both_lp.token_logprobs[-3:] == pytest.approx(logprobs.token_logprobs, abs=1e-3)


def test_echo_with_logprobs_scores_the_prompt(client: openai.OpenAI) -> None:
    both = client.completions.create(model=MODEL, prompt="Water is wet", max_tokens=1, logprobs=1, echo=True)
    prompt_values = both.choices[0].logprobs.token_logprobs[1 : both.usage.prompt_tokens]
    assert prompt_values and all(v is not None and v <= 0 for v in prompt_values)


def test_streaming_completions(client: openai.OpenAI) -> None:
    kw = {"model": MODEL, "prompt": ["Apples are", "Bananas are"], "max_tokens": 4, "temperature": 0}
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    for chunk in chunks:
        assert_completion_chunk(chunk.model_dump(exclude_unset=True))
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    texts: dict[int, str] = {}
    finishes: dict[int, int] = {}
    for chunk in chunks:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            finishes[ch.index] = finishes.get(ch.index, 0) + (ch.finish_reason is not None)
    assert finishes == {0: 1, 1: 1}
    full = client.completions.create(**kw)
    assert [texts[0], texts[1]] == [c.text for c in full.choices]


def test_streaming_echo(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, echo=True, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices).startswith("Hello")


def test_unsupported_completion_params(client: openai.OpenAI) -> None:
    for kwargs, param in (
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": []}, "prompt"),
    ):
        kwargs = {"prompt": "Hi", **kwargs}
        try:
            client.completions.create(model=MODEL, max_tokens=2, **kwargs)
        except openai.BadRequestError as exc:
            assert exc.response.json()["error"]["param"] == param
        else:
            raise AssertionError(f"{param} was accepted")
