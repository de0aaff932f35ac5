"""Operations: health, readiness, models, metrics, request ids and the JSON access log."""

from __future__ import annotations

import re
import time

import gateway_fixtures
import httpx
import openai
import pytest
from gateway_fixtures import API_KEY, LiveStack, assert_schema

client = gateway_fixtures.client
live = gateway_fixtures.live

AUTH = {"authorization": f"Bearer {API_KEY}"}


def test_health_and_ready_need_no_key(live: LiveStack) -> None:
    assert httpx.get(f"{live.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{live.url}/ready")
    assert ready.status_code == 200 and ready.json()["model"] == "SmolLM2-135M-Instruct"


def test_models_list_and_retrieve(live: LiveStack, client: openai.OpenAI) -> None:
    listing = httpx.get(f"{live.url}/v1/models", headers=AUTH).json()
    assert_schema("ListModelsResponse", listing)
    ids = {m["id"] for m in listing["data"]}
    assert {"SmolLM2-135M-Instruct", "all-MiniLM-L6-v2", "gpt-4o-mini", "text-embedding-3-small"} <= ids
    model = httpx.get(f"{live.url}/v1/models/gpt-4o-mini", headers=AUTH).json()
    assert_schema("Model", model)
    assert client.models.retrieve("SmolLM2-135M-Instruct").owned_by == "smolgate"


def test_request_id_is_echoed_and_logged_once(live: LiveStack, client: openai.OpenAI) -> None:
    rid = "my-request-42"
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        user="end-user-7",
        extra_headers={"x-request-id": rid},
    )
    assert raw.headers["x-request-id"] == rid
    resp = raw.parse()
    lines = live.log_lines_of(rid)
    assert len(lines) == 1
    line = lines[0]
    assert line["event"] == "request" and line["status"] == 200 and line["model"] == "SmolLM2-135M-Instruct"
    assert line["route"] == "/v1/chat/completions" and line["user"] == "end-user-7"
    assert line["prompt_tokens"] == resp.usage.prompt_tokens
    assert line["completion_tokens"] == resp.usage.completion_tokens
    assert line["ttft_ms"] > 0 and line["latency_ms"] >= line["ttft_ms"]
    generated = httpx.get(f"{live.url}/health").headers["x-request-id"]
    assert len(generated) == 32


def test_api_key_never_logged(live: LiveStack, client: openai.OpenAI) -> None:
    client.models.list()
    with pytest.raises(openai.AuthenticationError):
        live.client(api_key="sk-wrong-secret-123").models.list()
    text = live.log_path.read_text()
    assert API_KEY not in text and "sk-wrong-secret-123" not in text


def test_streaming_request_logged_with_ttft(live: LiveStack, client: openai.OpenAI) -> None:
    rid = "stream-log-1"
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=3,
        stream=True,
        extra_headers={"x-request-id": rid},
    )
    n = sum(1 for _ in stream)
    assert n > 0
    (line,) = live.log_lines_of(rid)
    assert line["stream"] is True and line["completion_tokens"] > 0 and line["ttft_ms"] > 0
    assert line["status"] == 200 and line["error"] is None


def test_metrics(live: LiveStack, client: openai.OpenAI) -> None:
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    wanted = 'smolgate_requests_total{model="SmolLM2-135M-Instruct",route="/v1/chat/completions",status="200"}'
    deadline = time.monotonic() + 5
    text = httpx.get(f"{live.url}/metrics", headers=AUTH).text  # the test key is an admin key too
    while wanted not in text and time.monotonic() < deadline:  # recorded just after the response
        time.sleep(0.02)
        text = httpx.get(f"{live.url}/metrics", headers=AUTH).text  # the test key is an admin key too
    for name in (
        'smolgate_requests_total{model="SmolLM2-135M-Instruct",route="/v1/chat/completions",status="200"}',
        "smolgate_request_duration_seconds_bucket",
        "smolgate_time_to_first_token_seconds_bucket",
        'smolgate_prompt_tokens_total{model="SmolLM2-135M-Instruct"}',
        'smolgate_completion_tokens_total{model="SmolLM2-135M-Instruct"}',
        "smolgate_engine_waiting_requests",
        "smolgate_kv_cache_blocks_used",
        "smolgate_kv_cache_usage_ratio",
        "smolgate_prefix_cache_hits_total",
        "smolgate_prefix_cache_queries_total",
        "smolgate_engine_up 1.0",
    ):
        assert name in text, name


def _counter(text: str, name: str, source: str) -> float:
    match = re.search(rf'^{name}_total{{source="{source}"}} (\S+)$', text, re.MULTILINE)
    assert match, (name, source)
    return float(match.group(1))


def test_metrics_count_speculation_per_source(live: LiveStack, client: openai.OpenAI) -> None:
    """Speculation is on by default; /metrics counts each source's proposed and accepted draft tokens."""
    text = "one two three four five six seven eight nine ten"
    client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": f"Repeat exactly: {text}. {text}."}],
        max_tokens=32, temperature=0,
    )
    metrics = httpx.get(f"{live.url}/metrics", headers=AUTH).text
    for source in ("reference", "ngram", "medusa", "draft"):
        assert _counter(metrics, "smolgate_spec_accepted_tokens", source) <= _counter(
            metrics, "smolgate_spec_proposed_tokens", source)
    assert _counter(metrics, "smolgate_spec_proposed_tokens", "ngram") > 0
