"""Every error class, as the OpenAI SDK sees it: right status, right exception, OpenAI error body."""

from __future__ import annotations

import time

import gateway_fixtures
import httpx
import openai
import pytest
from gateway_fixtures import API_KEY, MAX_BODY_BYTES, TEST_MAX_MODEL_LEN, LiveStack, assert_schema

client = gateway_fixtures.client
live = gateway_fixtures.live

MSG = [{"role": "user", "content": "Say hello."}]


def _error_of(exc: openai.APIStatusError) -> dict:
    body = exc.response.json()
    assert_schema("ErrorResponse", body)
    return body["error"]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"temperature": 5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools[0].function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"extra_body": {"frobnicate": True}}, "frobnicate"),
        ({"extra_body": {"top_k": -5}}, "top_k"),
    ],
)
def test_bad_values_are_400_naming_the_param(client: openai.OpenAI, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="gpt-4o-mini", messages=MSG, **{"max_tokens": 2, **kwargs})
    error = _error_of(info.value)
    assert error["type"] == "invalid_request_error" and error["param"] == param


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
        ([{"role": "function", "content": "x", "name": "f"}], "messages[0].role"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
            "messages[0].content[0].type",
        ),
        ([{"role": "user", "content": 42}], "messages[0].content"),
    ],
)
def test_bad_messages_are_400(client: openai.OpenAI, messages: list, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="gpt-4o-mini", messages=messages, max_tokens=2)
    assert _error_of(info.value)["param"] == param


def test_context_length_exceeded(client: openai.OpenAI) -> None:
    long_prompt = "hello " * (TEST_MAX_MODEL_LEN + 10)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": long_prompt}]
        )
    assert _error_of(info.value)["code"] == "context_length_exceeded"


def test_invalid_json_is_400(live: LiveStack) -> None:
    r = httpx.post(
        f"{live.url}/v1/chat/completions",
        content=b"{not json",
        headers={"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
    )
    assert r.status_code == 400
    assert_schema("ErrorResponse", r.json())


def test_missing_or_wrong_api_key_is_401(live: LiveStack) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        live.client(api_key="wrong-key").models.list()
    assert _error_of(info.value)["code"] == "invalid_api_key"
    for headers in ({}, {"authorization": "Basic abc"}, {"authorization": "Bearer"}):
        r = httpx.get(f"{live.url}/v1/models", headers=headers)
        assert r.status_code == 401
        assert_schema("ErrorResponse", r.json())


def test_unknown_model_and_route_are_404(client: openai.OpenAI, live: LiveStack) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17-ultra", messages=MSG, max_tokens=2)
    assert _error_of(info.value)["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-17-ultra")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="gpt-4o-mini", input="chat models do not embed")
    r = httpx.get(f"{live.url}/v1/no/such/route", headers={"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 404
    assert_schema("ErrorResponse", r.json())
    r = httpx.get(f"{live.url}/v1/chat/completions", headers={"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 405
    assert_schema("ErrorResponse", r.json())


def test_body_too_large_is_413(client: openai.OpenAI) -> None:
    huge = "x" * (MAX_BODY_BYTES + 1)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": huge}])
    assert info.value.status_code == 413
    _error_of(info.value)


def test_queue_full_is_429_with_retry_after(live: LiveStack) -> None:
    live.faulty.mode = "queue_full"
    with pytest.raises(openai.RateLimitError) as info:
        live.fault_client().chat.completions.create(model="gpt-4o-mini", messages=MSG, max_tokens=2)
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert _error_of(info.value)["code"] == "rate_limit_exceeded"
    with pytest.raises(openai.RateLimitError):  # before the stream starts: a plain HTTP error
        live.fault_client().chat.completions.create(
            model="gpt-4o-mini", messages=MSG, max_tokens=2, stream=True
        )


def test_internal_error_is_500_without_details(live: LiveStack) -> None:
    live.faulty.mode = "crash"
    with pytest.raises(openai.InternalServerError) as info:
        live.fault_client().completions.create(model="gpt-4o-mini", prompt="Hi", max_tokens=2)
    assert info.value.status_code == 500
    assert "secret" not in info.value.response.text
    assert "Traceback" not in info.value.response.text


def test_dead_engine_is_503(live: LiveStack) -> None:
    live.faulty.mode = "dead"
    with pytest.raises(openai.InternalServerError) as info:
        live.fault_client().chat.completions.create(model="gpt-4o-mini", messages=MSG, max_tokens=2)
    assert info.value.status_code == 503


def test_mid_stream_error_is_an_sse_error_event(live: LiveStack) -> None:
    live.faulty.mode = "mid_stream"
    stream = live.fault_client().chat.completions.create(
        model="gpt-4o-mini", messages=MSG, max_tokens=20, stream=True
    )
    received = []
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            received.append(chunk)
    assert received and received[0].choices[0].delta.role == "assistant"
    assert info.value.body["type"] == "server_error"
    assert live.wait_idle().kv_blocks_used == 0
    # raw wire format: an `event: error` carrying an OpenAI error body, then the stream ends (no [DONE])
    r = httpx.post(
        f"{live.fault_url}/v1/completions",
        json={"model": "gpt-4o-mini", "prompt": "Hi", "max_tokens": 20, "stream": True},
        headers={"authorization": f"Bearer {API_KEY}"},
    )
    assert 'event: error\ndata: {"error":' in r.text and "[DONE]" not in r.text


def test_client_disconnect_mid_stream_frees_kv_blocks(live: LiveStack) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": MSG,
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
    }
    headers = {"authorization": f"Bearer {API_KEY}", "x-request-id": "disconnect-mid-stream"}
    with httpx.stream("POST", f"{live.url}/v1/chat/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        data: list[str] = []
        for line in lines:
            if line.startswith("data:"):
                data.append(line)
            if len(data) >= 3:
                break
        assert live.engine.stats().kv_blocks_used > 0
        started = time.monotonic()
    stats = live.wait_idle()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0
    assert time.monotonic() - started < 5
    (line,) = live.log_lines_of("disconnect-mid-stream")
    assert line["error"] == "client_disconnected" and 0 < line["completion_tokens"] < 400


def test_client_timeout_on_non_streaming_request_frees_kv_blocks(live: LiveStack) -> None:
    body = {"model": "gpt-4o-mini", "messages": MSG, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{live.url}/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {API_KEY}", "x-request-id": "disconnect-non-streaming"},
            timeout=1.0,
        )
    stats = live.wait_idle()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0
    (line,) = live.log_lines_of("disconnect-non-streaming")
    assert line["status"] == 499 and line["error"] == "client_closed_request"
