"""/v1/messages and the response cache (tests/cache_fixtures.py: two API keys, the real engine and embedder):
entries are per key (x-api-key or Bearer: one tenant), semantic hits replay as Anthropic messages, and a
/v1/messages request shares entries with the equivalent chat request (one pipeline, one cache)."""

from __future__ import annotations

import uuid
from typing import Any

import anthropic
import cache_fixtures
import openai
from cache_fixtures import OTHER_KEY, CacheStack
from gateway_fixtures import API_KEY

cache_stack = cache_fixtures.cache_stack

MODEL = "SmolLM2-135M-Instruct"


def _client(stack: CacheStack, key: str = API_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.urls["memory"], api_key=key, max_retries=0, timeout=120)


def _unique(text: str) -> str:
    return f"{text} (case {uuid.uuid4().int % 10**8})"


def _create(client: anthropic.Anthropic, **kw: Any) -> tuple[anthropic.types.Message, str]:
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=6, extra_body={"temperature": 0}, **kw)
    return raw.parse(), raw.headers["x-cache"]


def test_tenants_never_share_entries(cache_stack: CacheStack) -> None:
    ask = [{"role": "user", "content": _unique("Name a tree.")}]
    first, status = _create(_client(cache_stack), messages=ask)
    assert status == "miss"
    assert _create(_client(cache_stack, OTHER_KEY), messages=ask)[1] == "miss"
    again, status = _create(_client(cache_stack), messages=ask)
    assert status == "hit" and again.content == first.content and again.usage == first.usage


def test_semantic_hit_replays_as_a_message(cache_stack: CacheStack) -> None:
    system = _unique("You are a geography tutor.")
    original, _ = _create(
        _client(cache_stack), system=system, messages=[{"role": "user", "content": "What is the capital of France?"}]
    )
    raw = _client(cache_stack).messages.with_raw_response.create(
        model=MODEL, max_tokens=6, extra_body={"temperature": 0}, system=system,
        messages=[{"role": "user", "content": "What's the capital of France?"}],
    )  # fmt: skip
    assert raw.headers["x-cache"] == "semantic-hit" and float(raw.headers["x-cache-similarity"]) >= 0.86
    assert raw.parse().content == original.content
    other = [{"role": "user", "content": "What's the capital of France?"}]
    assert _create(_client(cache_stack, OTHER_KEY), system=system, messages=other)[1] == "miss"


def test_a_messages_request_and_the_same_chat_request_share_an_entry(cache_stack: CacheStack) -> None:
    question = _unique("Name a color.")
    chat = openai.OpenAI(base_url=f"{cache_stack.urls['memory']}/v1", api_key=API_KEY, max_retries=0, timeout=120)
    raw = chat.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=6, temperature=0, messages=[{"role": "user", "content": question}]
    )
    assert raw.headers["x-cache"] == "miss"
    msg, status = _create(_client(cache_stack), messages=[{"role": "user", "content": question}])
    assert status == "hit" and msg.content[0].text == raw.parse().choices[0].message.content
