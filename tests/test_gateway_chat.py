"""Chat completions through the real OpenAI SDK against a live server and the real engine."""

from __future__ import annotations

import gateway_fixtures
import openai
import pytest
from gateway_fixtures import LiveStack, assert_schema

client = gateway_fixtures.client
live = gateway_fixtures.live

MSG = [{"role": "user", "content": "Name three colors."}]


def _dump(obj: openai.BaseModel) -> dict:
    return obj.model_dump(exclude_unset=True)


def test_chat_non_streaming_shape_and_alias(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=MSG, max_tokens=6)
    assert raw.headers["x-request-id"]
    resp = raw.parse()
    assert_schema("CreateChatCompletionResponse", raw.http_response.json())
    assert resp.id.startswith("chatcmpl-")
    assert resp.model == "SmolLM2-135M-Instruct"
    (choice,) = resp.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = resp.usage
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_streaming_follows_openai(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=MSG,
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for chunk in chunks:
        assert_schema("CreateChatCompletionStreamResponse", _dump(chunk))
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    assert len(finishes) == 1
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens >= 0
    text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
    assert usage_chunk.usage.completion_tokens <= 6 and text


def test_stream_and_non_stream_same_text_at_temperature_0(client: openai.OpenAI) -> None:
    kw = {"model": "gpt-4o-mini", "messages": MSG, "max_tokens": 12, "temperature": 0}
    full = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
    )
    assert streamed == full


def test_n_choices_streaming_and_not(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="gpt-4o-mini", messages=MSG, max_tokens=4, n=3, temperature=1.0
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert 3 <= resp.usage.completion_tokens <= 12
    chunks = list(
        client.chat.completions.create(model="gpt-4o-mini", messages=MSG, max_tokens=4, n=2, stream=True)
    )
    per_index: dict[int, int] = {}
    for chunk in chunks:
        assert_schema("CreateChatCompletionStreamResponse", _dump(chunk))
        for ch in chunk.choices:
            per_index[ch.index] = per_index.get(ch.index, 0) + (ch.finish_reason is not None)
    assert per_index == {0: 1, 1: 1}


def test_stop_sequence(client: openai.OpenAI) -> None:
    kw = {"model": "gpt-4o-mini", "messages": MSG, "max_tokens": 16, "temperature": 0}
    text = client.chat.completions.create(**kw).choices[0].message.content
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    resp = client.chat.completions.create(stop=[stop, "zzzz"], **kw)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    assert stop not in choice.message.content
    assert text.startswith(choice.message.content)
    single = client.chat.completions.create(stop=stop, **kw).choices[0].message.content
    assert single == choice.message.content


def test_seed_reproducibility(client: openai.OpenAI) -> None:
    kw = {"model": "gpt-4o-mini", "messages": MSG, "max_tokens": 8, "temperature": 1.0}
    a = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {client.chat.completions.create(seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1


def test_logprobs_and_top_logprobs(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=MSG, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3
    )
    assert_schema("CreateChatCompletionResponse", raw.http_response.json())
    choice = raw.parse().choices[0]
    content = choice.logprobs.content
    assert len(content) == raw.parse().usage.completion_tokens
    assert "".join(t.token for t in content) == choice.message.content
    for tok in content:
        assert tok.logprob <= 0 and len(tok.top_logprobs) == 3
        assert tok.logprob == pytest.approx(max(t.logprob for t in tok.top_logprobs), abs=1e-4)  # greedy
        assert bytes(tok.bytes).decode("utf-8", errors="replace") == tok.token
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MSG,
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=1,
        stream=True,
    )
    chunks = list(stream)
    for chunk in chunks:
        assert_schema("CreateChatCompletionStreamResponse", _dump(chunk))
    streamed = [t for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in content[:3]]


def test_logit_bias_string_keys(client: openai.OpenAI, live: LiveStack) -> None:
    token = live.engine.tokenize(" banana")[0]
    resp = client.chat.completions.create(
        model="gpt-4o-mini", messages=MSG, max_tokens=3, temperature=0, logit_bias={str(token): 100}
    )
    assert resp.choices[0].message.content == live.engine.detokenize([token] * 3)


def test_max_completion_tokens_and_extensions(client: openai.OpenAI) -> None:
    resp = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MSG,
        max_completion_tokens=5,
        temperature=0.7,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        user="user-1",
        extra_body={
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "min_tokens": 5,
            "ignore_eos": True,
        },
    )
    assert resp.usage.completion_tokens == 5
    assert resp.choices[0].finish_reason == "length"


def test_top_k_1_is_greedy(client: openai.OpenAI) -> None:
    kw = {"model": "gpt-4o-mini", "messages": MSG, "max_tokens": 6}
    greedy = client.chat.completions.create(temperature=0, **kw).choices[0].message.content
    top1 = client.chat.completions.create(temperature=1.0, seed=7, extra_body={"top_k": 1}, **kw)
    assert top1.choices[0].message.content == greedy


def test_all_roles_parts_and_names(client: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": [{"type": "text", "text": "Answer in one word."}]},
        {
            "role": "user",
            "name": "alice",
            "content": [{"type": "text", "text": "Hi!"}, {"type": "text", "text": "Sky?"}],
        },
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Grass?"},
    ]
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=3)
    assert resp.choices[0].message.content is not None


def test_prefix_cache_reports_cached_tokens(client: openai.OpenAI) -> None:
    system = "You are a helpful assistant who answers questions about colors. " * 8
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Which color is the sky?"}]
    client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=2)
    again = client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=messages,
        max_tokens=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = next(c.usage for c in stream if c.usage)
    assert usage.prompt_tokens_details.cached_tokens > 0
