"""Anthropic's Messages API (/v1/messages) through the official `anthropic` SDK against the live server and
the real engine: create, stream (the SDK's accumulated message equals the non-streamed one), stop reasons,
stop sequences, tools round trip, structured output, count_tokens, the response cache, auth and errors."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import gateway_fixtures
import httpx
import pytest
from client_requests import CLAUDE_CODE, CLAUDE_CODE_LEFT_OUT
from gateway_fixtures import API_KEY, LiveStack
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

live = gateway_fixtures.live

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "Name a fruit."}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER},
    {
        "name": "add",
        "description": "Add two integers",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
# The current SDK's types no longer list temperature/top_p/top_k (the API still takes them): extra_body sends them.
# Greedy decoding makes answers comparable, and cacheable (the exact cache keeps deterministic requests only).
GREEDY = {"temperature": 0}


def _client(live: LiveStack, **kw: Any) -> anthropic.Anthropic:
    kw.setdefault("api_key", API_KEY)
    return anthropic.Anthropic(base_url=kw.pop("url", live.url), max_retries=0, timeout=120, **kw)


@pytest.fixture()
def client(live: LiveStack) -> anthropic.Anthropic:
    return _client(live)


def _create(client: anthropic.Anthropic, **kw: Any) -> anthropic.types.Message:
    kw.setdefault("model", MODEL)
    kw.setdefault("max_tokens", 12)
    kw.setdefault("extra_body", GREEDY)
    kw.setdefault("messages", ASK)
    return client.messages.create(**kw)


def _streamed(client: anthropic.Anthropic, **kw: Any) -> tuple[anthropic.types.Message, list[str]]:
    """The SDK's accumulated final message, and the event types as they came."""
    kw.setdefault("model", MODEL)
    kw.setdefault("max_tokens", 12)
    kw.setdefault("extra_body", GREEDY)
    kw.setdefault("messages", ASK)
    with client.messages.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        return stream.get_final_message(), kinds


def _prompt(usage: Any) -> int:
    """The prompt's tokens: those computed and those read from the prefix cache."""
    if isinstance(usage, dict):
        return int(usage["input_tokens"]) + int(usage.get("cache_read_input_tokens") or 0)
    return int(usage.input_tokens) + int(usage.cache_read_input_tokens or 0)


def _same(a: anthropic.types.Message, b: anthropic.types.Message) -> None:
    """Equal but for the message id and the tool-use ids."""

    def strip(m: anthropic.types.Message) -> dict[str, Any]:
        d = m.model_dump(exclude_none=True)
        d.pop("id")
        d["usage"] = (_prompt(m.usage), m.usage.output_tokens)  # a second run reads more from the prefix cache
        for block in d["content"]:
            if block["type"] == "tool_use":
                assert block.pop("id").startswith("toolu_")
        return d

    assert strip(a) == strip(b)


def test_create_returns_an_anthropic_message(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model=MODEL, max_tokens=12, extra_body=GREEDY, system="You are terse.", messages=ASK, metadata={"user_id": "u-42"}
    )
    msg = raw.parse()
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == MODEL
    (block,) = msg.content
    assert block.type == "text" and block.text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.stop_sequence is None
    assert msg.usage.input_tokens > 0 and 0 < msg.usage.output_tokens <= 12
    assert raw.headers["request-id"] and raw.headers["x-request-id"] == raw.headers["request-id"]
    body = raw.http_response.json()
    assert set(body) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}


def test_access_log_and_metrics_name_the_messages_route(live: LiveStack, client: anthropic.Anthropic) -> None:
    rid = "messages-log-test-1"
    # a question no other test asks: an exact-cache hit from an earlier test would log no engine tokens
    ask = [{"role": "user", "content": "Name a fruit that grows on trees."}]
    msg = _create(client, messages=ask, metadata={"user_id": "end-user-9"}, extra_headers={"x-request-id": rid})
    (line,) = live.log_lines_of(rid)
    assert line["route"] == "/v1/messages" and line["status"] == 200 and line["model"] == MODEL
    assert line["user"] == "end-user-9" and line["prompt_tokens"] == _prompt(msg.usage)
    assert line["completion_tokens"] == msg.usage.output_tokens and API_KEY not in json.dumps(line)
    metrics = httpx.get(f"{live.url}/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text
    assert f'smolgate_requests_total{{model="{MODEL}",route="/v1/messages",status="200"}}' in metrics


def test_string_and_block_content_and_system_blocks_are_one_prompt(client: anthropic.Anthropic) -> None:
    plain = _create(client, system="You are terse.", messages=[{"role": "user", "content": "Name a fruit."}])
    blocks = _create(
        client,
        system=[{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]}],
    )
    assert plain.content == blocks.content and _prompt(plain.usage) == _prompt(blocks.usage)


def test_max_tokens_stop_reason(client: anthropic.Anthropic) -> None:
    msg = _create(client, max_tokens=3, messages=[{"role": "user", "content": "Tell me a long story about a dragon."}])
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 3


def test_a_max_tokens_beyond_the_context_window_is_a_cap(client: anthropic.Anthropic) -> None:
    """Clients send Anthropic-sized max_tokens (thousands): generation stops at the context window instead."""
    counted = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "word " * 2000}])
    room = gateway_fixtures.TEST_MAX_MODEL_LEN - counted.input_tokens
    assert 0 < room < 40, counted
    filler = [{"role": "user", "content": "word " * 2000}]
    msg = _create(client, max_tokens=64_000, messages=filler, extra_body=GREEDY)
    assert _prompt(msg.usage) == counted.input_tokens and msg.usage.output_tokens <= room
    assert msg.stop_reason in ("end_turn", "model_context_window_exceeded")
    assert (msg.stop_reason == "model_context_window_exceeded") == (msg.usage.output_tokens == room)


def test_stream_assembles_the_same_message(client: anthropic.Anthropic) -> None:
    msg = _create(client, max_tokens=16)
    final, kinds = _streamed(client, max_tokens=16)
    _same(msg, final)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert "text" in kinds  # the SDK's text event, one per text_delta


def test_raw_stream_events_in_order_with_ping(live: LiveStack) -> None:
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": ASK, "stream": True}
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{live.url}/v1/messages", json=body, headers=headers, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    events = [block for block in text.split("\n\n") if block.strip()]
    names = [e.split("\n")[0].removeprefix("event: ") for e in events]
    datas = [json.loads(e.split("\n")[1].removeprefix("data: ")) for e in events]
    assert all(d["type"] == n for n, d in zip(names, datas, strict=True))
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    start = datas[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    deltas = [d for d in datas if d["type"] == "content_block_delta"]
    assert deltas and all(d["delta"]["type"] == "text_delta" and d["index"] == 0 for d in deltas)
    end = datas[-2]
    assert end["delta"]["stop_reason"] in ("end_turn", "max_tokens") and 0 < end["usage"]["output_tokens"] <= 8
    assert _prompt(end["usage"]) == start["usage"]["input_tokens"]


def test_stop_sequences(client: anthropic.Anthropic) -> None:
    full = _create(client, max_tokens=16).content[0].text
    words = full.split()
    assert len(words) >= 2, full
    stop = " " + words[1]
    cut = _create(client, max_tokens=16, stop_sequences=[stop, "never appears"])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == full[: full.index(stop)]
    final, _ = _streamed(client, max_tokens=16, stop_sequences=[stop, "never appears"])
    _same(cut, final)
    plain = _create(client, max_tokens=16, stop_sequences=["never appears"])
    assert plain.stop_sequence is None and plain.content[0].text == full


def test_forced_tool_use_and_round_trip(client: anthropic.Anthropic) -> None:
    msg = _create(client, max_tokens=40, messages=WEATHER_Q, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"})
    assert msg.stop_reason == "tool_use"
    (use,) = [b for b in msg.content if b.type == "tool_use"]
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    Draft202012Validator(WEATHER).validate(use.input)
    history = [
        *WEATHER_Q,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 degrees and sunny"}]},
    ]
    answer = _create(client, max_tokens=24, messages=history, tools=TOOLS)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    blocks = [{"type": "text", "text": "18 degrees"}, {"type": "text", "text": "and sunny"}]
    history[-1]["content"] = [{"type": "tool_result", "tool_use_id": use.id, "content": blocks, "is_error": False}]
    assert _create(client, max_tokens=8, messages=history, tools=TOOLS).content


def test_streamed_tool_use_matches(client: anthropic.Anthropic) -> None:
    kw = {
        "max_tokens": 40,
        "messages": WEATHER_Q,
        "tools": TOOLS,
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
    }
    msg = _create(client, **kw)
    final, kinds = _streamed(client, **kw)
    _same(msg, final)
    assert final.stop_reason == "tool_use" and "input_json" in kinds
    assert all(b.type == "tool_use" for b in final.content)


def test_tool_choice_none_and_auto(client: anthropic.Anthropic) -> None:
    none = _create(client, messages=WEATHER_Q, tools=TOOLS, tool_choice={"type": "none"})
    assert [b.type for b in none.content] == ["text"] and none.stop_reason != "tool_use"
    auto = _create(client, max_tokens=40, messages=WEATHER_Q, tools=TOOLS)
    assert auto.content and auto.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert (auto.stop_reason == "tool_use") == any(b.type == "tool_use" for b in auto.content)


def test_structured_output_through_constrained_decoding(client: anthropic.Anthropic) -> None:
    schema = {"type": "object", "properties": {"fruit": {"type": "string", "maxLength": 12}}, "required": ["fruit"]}
    msg = _create(client, max_tokens=30, output_config={"format": {"type": "json_schema", "schema": schema}})
    Draft202012Validator(schema).validate(json.loads(msg.content[0].text))


class Fruit(BaseModel):
    fruit: str = Field(max_length=12)


def test_sdk_parse_with_a_pydantic_output_format(client: anthropic.Anthropic) -> None:
    parsed = client.messages.parse(model=MODEL, max_tokens=30, messages=ASK, output_format=Fruit, extra_body=GREEDY)
    assert isinstance(parsed.parsed_output, Fruit) and parsed.parsed_output.fruit


def test_count_tokens_equals_the_prompt_usage(client: anthropic.Anthropic) -> None:
    for kw in ({"system": "You are terse.", "messages": ASK}, {"messages": WEATHER_Q, "tools": TOOLS}):
        counted = client.messages.count_tokens(model=MODEL, **kw)
        assert counted.input_tokens > 0
        assert counted.input_tokens == _prompt(_create(client, max_tokens=1, **kw).usage)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="mistral-nonexistent", messages=ASK)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [{"type": "image"}]}])


def test_exact_cache_hit_replays_as_a_message_and_a_stream(client: anthropic.Anthropic) -> None:
    kw = {"max_tokens": 10, "messages": [{"role": "user", "content": "Name a planet, please (messages cache test)."}]}
    first = client.messages.with_raw_response.create(model=MODEL, extra_body=GREEDY, **kw)
    second = client.messages.with_raw_response.create(model=MODEL, extra_body=GREEDY, **kw)
    assert first.headers["x-cache"] == "miss" and second.headers["x-cache"] == "hit"
    _same(first.parse(), second.parse())
    with client.messages.stream(model=MODEL, extra_body=GREEDY, **kw) as stream:
        final = stream.get_final_message()
        assert stream.response.headers["x-cache"] == "hit"
    _same(first.parse(), final)


def test_bearer_auth_and_x_api_key_are_one_tenant(live: LiveStack) -> None:
    bearer = _client(live, api_key=None, auth_token=API_KEY)
    kw = {"max_tokens": 6, "messages": [{"role": "user", "content": "Say hello (tenant test)."}]}
    assert bearer.messages.with_raw_response.create(model=MODEL, extra_body=GREEDY, **kw).headers["x-cache"] == "miss"
    hit = _client(live).messages.with_raw_response.create(model=MODEL, extra_body=GREEDY, **kw)
    assert hit.headers["x-cache"] == "hit"


def _error(exc: anthropic.APIStatusError, kind: str) -> str:
    body = exc.response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["request_id"] == exc.response.headers["request-id"]
    return str(body["error"]["message"])


def test_auth_errors(live: LiveStack) -> None:
    with pytest.raises(anthropic.AuthenticationError) as info:
        _create(_client(live, api_key="sk-wrong"))
    _error(info.value, "authentication_error")
    resp = httpx.post(f"{live.url}/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": ASK})
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "authentication_error"
    assert "x-api-key" in resp.json()["error"]["message"]


def test_unknown_model_is_not_found(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        _create(client, model="mistral-large-latest")
    assert "mistral-large-latest" in _error(info.value, "not_found_error")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}]}
                ]
            },
            "messages[0].content[0].content[0]",
        ),
        ({"thinking": {"type": "sometimes"}}, "thinking.type"),
        (
            {
                "tools": [{"type": "web_search_20250305", "name": "web_search"}, *TOOLS],
                "tool_choice": {"type": "tool", "name": "web_search"},
            },
            "tool_choice.name",
        ),
        ({"messages": [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "add"}]}]}, "messages[1]"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop_sequences": "END"}, "stop_sequences"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "required"}}, "tool_choice.type"),
        ({"output_config": {"effort": "high", "verbosity": "low"}}, "output_config.verbosity"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
        ({"metadata": {"user_id": "u", "plan": "pro"}}, "metadata.plan"),
        ({"container": "c-1"}, "container"),
        ({"output_config": {"format": {"type": "json_schema", "schema": {"not": {"type": "string"}}}}}, "not"),
        ({"messages": [{"role": "user", "content": "word " * 3000}]}, "prompt is too long: "),
    ],
)
def test_bad_or_unsupported_input_is_a_400_naming_the_field(live: LiveStack, change: dict[str, Any], named: str) -> None:
    body = {"model": MODEL, "max_tokens": 4, "messages": ASK, **change}
    resp = httpx.post(f"{live.url}/v1/messages", json=body, headers={"x-api-key": API_KEY}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and named in error["message"], error


def test_missing_max_tokens_and_broken_json_are_400s(live: LiveStack) -> None:
    headers = {"x-api-key": API_KEY, "content-type": "application/json"}
    resp = httpx.post(f"{live.url}/v1/messages", json={"model": MODEL, "messages": ASK}, headers=headers)
    assert resp.status_code == 400 and "max_tokens" in resp.json()["error"]["message"]
    resp = httpx.post(f"{live.url}/v1/messages", content=b"{not json", headers=headers)
    assert resp.status_code == 400 and resp.json()["type"] == "error"
    resp = httpx.get(f"{live.url}/v1/messages", headers=headers)
    assert resp.status_code == 405 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = httpx.post(f"{live.url}/v1/messages", content=b"x" * (gateway_fixtures.MAX_BODY_BYTES + 1), headers=headers)
    assert resp.status_code == 413 and resp.json()["type"] == "error"


def test_bad_request_is_the_sdks_bad_request_error(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        _create(
            client,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
                }
            ],
        )
    assert "text only" in _error(info.value, "invalid_request_error")


def test_engine_faults_are_anthropic_errors(live: LiveStack) -> None:
    fault = _client(live, url=live.fault_url)
    live.faulty.mode = "queue_full"
    with pytest.raises(anthropic.OverloadedError) as busy:
        _create(fault)
    _error(busy.value, "overloaded_error")
    assert busy.value.response.status_code == 529 and busy.value.response.headers["retry-after"]
    live.faulty.mode = "dead"
    with pytest.raises(anthropic.OverloadedError):
        _create(fault)
    live.faulty.mode = "crash"
    with pytest.raises(anthropic.InternalServerError) as crash:
        _create(fault)
    assert "secret" not in _error(crash.value, "api_error")
    live.faulty.mode = "mid_stream"
    with pytest.raises(anthropic.APIStatusError) as broken:
        _streamed(fault)
    assert broken.value.body["type"] == "error" and broken.value.body["error"]["type"] == "api_error"
    assert "secret" not in str(broken.value.body)


def test_claude_code_first_request_is_served(live: LiveStack) -> None:
    headers = {"x-api-key": API_KEY, "anthropic-beta": "claude-code-20250219,context-management-2025-06-27"}
    body = {**CLAUDE_CODE, "max_tokens": 8}
    resp = httpx.post(f"{live.url}/v1/messages?beta=true", json=body, headers=headers, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.headers["smolgate-tools-left-out"] == ",".join(CLAUDE_CODE_LEFT_OUT)
    events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "message_start" and events[0]["message"]["model"] == MODEL  # the served model answers
    assert events[-1]["type"] == "message_stop"
    counted = httpx.post(
        f"{live.url}/v1/messages/count_tokens",
        json={k: v for k, v in body.items() if k not in ("max_tokens", "stream", "metadata")},
        headers=headers,
    )
    assert counted.status_code == 200 and counted.json()["input_tokens"] == events[0]["message"]["usage"]["input_tokens"]


def test_prefill_is_continued(client: anthropic.Anthropic) -> None:
    """A final assistant message is the start of the answer: the prompt ends inside it (no end of turn)."""
    prefill = [*ASK, {"role": "assistant", "content": "My favourite fruit is the"}]
    closed = [*prefill, {"role": "user", "content": "Go on."}]
    open_count = client.messages.count_tokens(model=MODEL, messages=prefill).input_tokens
    closed_count = client.messages.count_tokens(model=MODEL, messages=closed).input_tokens
    go_on = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Go on."}]).input_tokens
    ask = client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens
    # the closed conversation adds the end of the assistant turn and a user turn; the open one neither
    assert closed_count > open_count + go_on - ask
    message = _create(client, messages=prefill, max_tokens=6)
    assert message.content[0].text and _prompt(message.usage) == open_count


def test_models_in_anthropics_shape_when_asked(live: LiveStack) -> None:
    headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    listed = httpx.get(f"{live.url}/v1/models", headers=headers).json()
    assert listed["has_more"] is False and listed["first_id"] == listed["data"][0]["id"]
    assert MODEL in [m["id"] for m in listed["data"]]
    assert all(m["type"] == "model" and m["created_at"].endswith("Z") for m in listed["data"])
    one = httpx.get(f"{live.url}/v1/models/claude-sonnet-4-5", headers=headers).json()
    assert one["type"] == "model" and one["id"] == "claude-sonnet-4-5"  # an alias pattern, shown under its own name
    assert httpx.get(f"{live.url}/v1/models", headers={"x-api-key": API_KEY}).json()["object"] == "list"
