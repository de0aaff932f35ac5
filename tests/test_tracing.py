"""OpenTelemetry traces end to end: real gateways with the real embedded model export over OTLP/HTTP to a real
receiver in this process (tests/otlp_receiver.py), which decodes the protobuf; the tests check the span tree and its
GenAI attributes.

The rig: a client -> a torch-free router gateway -> model `flaky` (a fault-injecting upstream, tests/routing_fixtures.py,
answering 500: a first attempt and a retry fail) -> its fallback `smollm` (a deployment of kind backend: a second
gateway with the embedded engine, which traces its own side of the request as a child of the router's attempt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from cache_fixtures import free_port
from gateway_fixtures import gateway_test_config
from otlp_receiver import ExportedSpan, Receiver
from routing_fixtures import FakeUpstream, Servers

from bench.server import stop_processes, wait_ready
from gateway.app import build_context, build_tracing, create_app
from gateway.config import ConfigError, GatewayConfig, apply_env, from_mapping
from gateway.tracing import genai
from gateway.tracing.config import TracesConfig
from gateway.tracing.middleware import TracingMiddleware

ROUTER_KEY = "sk-router-key-for-tracing-0001"
BACKEND_KEY = "sk-backend-key-for-tracing-0002"
UPSTREAM_KEY = "sk-upstream-key-for-tracing-0003"
MODEL = "SmolLM2-135M-Instruct"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Rig:
    receiver: Receiver
    router: str  # traced router gateway
    local_router: str  # traced router gateway whose model `local` is its own embedded engine
    plain_router: str  # the same routes, tracing off
    content_router: str  # traced router gateway with traces.content, whose model `smollm` is the backend
    backend: str  # traced embedded gateway (the router's backend deployment)
    content: str  # traced embedded gateway with traces.content
    fake: FakeUpstream
    fake_url: str
    tracings: list[Any]

    def flush(self) -> None:
        for t in self.tracings:
            t.flush()

    def client(self, url: str, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)

    def trace(self, trace_id: str, roots: int = 1, expect: int = 1) -> list[ExportedSpan]:
        """The spans of one trace, once it has `expect` spans or more and its `roots` server spans have ended."""

        def done(spans: list[ExportedSpan]) -> bool:
            mine = [s for s in spans if s.trace_id == trace_id]
            return len(mine) >= expect and sum(s.kind == "server" for s in mine) >= roots

        return [s for s in self.receiver.wait(done, self.flush) if s.trace_id == trace_id]


def _traces(receiver: Receiver, service: str, content: bool = False) -> dict[str, Any]:
    return {"endpoint": f"{receiver.url}/v1/traces", "service_name": service, "content": content}


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    from backend.engine.async_engine import AsyncEngine

    receiver = Receiver()
    receiver.start()
    fake = FakeUpstream("flaky", default="500")
    upstreams = Servers()
    (fake_url,) = upstreams.start([fake.app()])
    engine_cfg = gateway_test_config().engine
    engine = AsyncEngine.from_config(engine_cfg)
    # batches off: the Files/Batches directory is shared by every gateway on the machine
    embedded = {"api_keys": [BACKEND_KEY], "embeddings": False, "cache": {"backend": "memory"}, "batches": {"enabled": False}}
    backend_cfg = from_mapping({**embedded, "traces": _traces(receiver, "backend")})
    backend_ctx = build_context(replace(backend_cfg, engine=engine_cfg), engine)
    content_cfg = from_mapping({**embedded, "traces": _traces(receiver, "content", content=True)})
    content_ctx = build_context(replace(content_cfg, engine=engine_cfg), engine)
    local_cfg = from_mapping({**embedded, "models": {"local": {"deployments": [{"kind": "embedded"}]}},
                              "traces": _traces(receiver, "local")})  # fmt: skip
    local_ctx = build_context(replace(local_cfg, engine=engine_cfg), engine)
    backends = Servers()
    backend_url, content_url, local_url = backends.start(
        [create_app(backend_ctx), create_app(content_ctx, manage_engine=False), create_app(local_ctx, manage_engine=False)]
    )
    env = {"UPSTREAM": UPSTREAM_KEY, "BACKEND": BACKEND_KEY}
    routed = {
        "api_keys": [ROUTER_KEY], "embeddings": False, "cache": {"backend": "off"}, "batches": {"enabled": False},
        "models": {
            "flaky": {"deployments": [{"kind": "openai", "name": "f", "base_url": f"{fake_url}/v1", "api_key_env": "UPSTREAM"}]},
            "dead": {"deployments": [{"kind": "openai", "name": "d", "base_url": f"http://127.0.0.1:{free_port()}/v1"}]},
            "smollm": {"deployments": [{"kind": "backend", "name": "b1", "base_url": f"{backend_url}/v1", "model": MODEL,
                                        "api_key_env": "BACKEND", "timeout_s": 120.0, "first_token_timeout_s": 120.0}]},
        },
        "fallbacks": {"flaky": ["smollm"], "dead": ["smollm"]},
        "router": {"num_retries": 1, "backoff_base_s": 0.01, "cooldown_failures": 100},
    }  # fmt: skip
    router_ctx = build_context(from_mapping({**routed, "traces": _traces(receiver, "router")}, env), None)
    plain_ctx = build_context(from_mapping(routed, env), None)
    captured = {**routed, "models": {"smollm": routed["models"]["smollm"]}, "fallbacks": {},
                "traces": _traces(receiver, "content-router", content=True)}  # fmt: skip
    content_router_ctx = build_context(from_mapping(captured, env), None)
    routers = Servers()
    router_url, plain_url, content_router_url = routers.start(
        [create_app(router_ctx), create_app(plain_ctx), create_app(content_router_ctx)]
    )
    tracings = [router_ctx.tracing, backend_ctx.tracing, content_ctx.tracing, local_ctx.tracing, content_router_ctx.tracing]
    yield Rig(receiver, router_url, local_url, plain_url, content_router_url, backend_url, content_url, fake, fake_url,
              tracings)  # fmt: skip
    routers.stop()
    backends.stop()
    upstreams.stop()
    receiver.stop()


def _by_id(spans: list[ExportedSpan]) -> dict[str, ExportedSpan]:
    return {s.span_id: s for s in spans}


def _children(spans: list[ExportedSpan], parent: ExportedSpan) -> list[ExportedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def test_a_routed_request_is_one_trace_through_retries_the_fallback_and_the_backends_engine(rig: Rig) -> None:
    rig.fake.play(default="500")
    raw = rig.client(rig.router, ROUTER_KEY).chat.completions.with_raw_response.create(
        model="flaky", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8, temperature=0,
        extra_headers={"traceparent": TRACEPARENT},
    )
    answer = raw.parse()
    assert raw.headers["x-smolgate-model"] == "smollm" and answer.usage is not None
    spans = rig.trace(TRACE_ID, roots=2, expect=11)
    assert all(s.end_ns >= s.start_ns > 0 for s in spans)
    by_id = _by_id(spans)
    # the router's server span is the client's span's child (the incoming traceparent was honoured)
    (root,) = [s for s in spans if s.service == "router" and s.kind == "server"]
    assert root.parent_id == CLIENT_SPAN and root.name == "POST /v1/chat/completions"
    a = root.attrs
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "flaky"
    assert a["gen_ai.response.model"] == "smollm" and a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.request.temperature"] == 0 and a["http.response.status_code"] == 200
    assert a["gen_ai.usage.input_tokens"] == answer.usage.prompt_tokens > 0
    assert a["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens > 0
    assert a["smolgate.deployment"] == "b1" and not root.error
    (first_token,) = [e for e in root.events if e.name == "gen_ai.first_token"]
    assert root.start_ns < first_token.time_ns <= root.end_ns
    # router -> two failed attempts on flaky (the first try and its retry) -> the fallback's attempt on the backend
    (router,) = _children(spans, root)
    assert router.name == "router flaky" and router.attrs["smolgate.router.fallbacks"] == ["smollm"]
    attempts = _children(spans, router)
    assert [s.name for s in attempts] == ["chat flaky", "chat flaky", f"chat {MODEL}"]
    assert all(s.kind == "client" for s in attempts)
    assert [s.attrs["smolgate.attempt"] for s in attempts] == [0, 1, 0]
    assert [s.error for s in attempts] == [True, True, False]
    assert [s.attrs.get("error.type") for s in attempts[:2]] == ["500", "500"]
    assert attempts[0].attrs["gen_ai.provider.name"] == "openai" and attempts[0].attrs["server.address"] == "127.0.0.1"
    fallback = attempts[2]
    assert fallback.attrs["smolgate.fallback_of"] == "flaky" and fallback.attrs["smolgate.deployment.kind"] == "backend"
    assert fallback.attrs["server.port"] == int(rig.backend.rsplit(":", 1)[1])
    assert fallback.attrs["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    # the upstreams got the trace context: each attempt's span is its request's parent
    sent = [h["traceparent"] for h in rig.fake.headers]
    assert sent == [f"00-{TRACE_ID}-{s.span_id}-01" for s in attempts[:2]]
    # the backend's side: a child of the fallback attempt, with the cache lookup and the engine's work
    (backend,) = [s for s in spans if s.service == "backend" and s.kind == "server"]
    assert by_id[backend.parent_id] is fallback
    assert backend.attrs["gen_ai.request.model"] == MODEL and backend.attrs["gen_ai.response.model"] == MODEL
    assert backend.attrs["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    cache, engine = _children(spans, backend)
    # a router without cache.tenant_secret tells its backends not to cache (gateway/cache/tenancy.py)
    assert cache.name == "cache.lookup" and cache.attrs["smolgate.cache.result"] == "bypass"
    assert engine.name == f"engine {MODEL}" and engine.attrs["gen_ai.request.max_tokens"] == 8
    assert engine.attrs["gen_ai.usage.output_tokens"] == answer.usage.completion_tokens
    queue, prefill, decode = _children(spans, engine)
    assert [queue.name, prefill.name, decode.name] == ["engine.queue", "engine.prefill", "engine.decode"]
    assert engine.start_ns <= queue.start_ns <= queue.end_ns <= prefill.start_ns <= prefill.end_ns
    assert prefill.end_ns <= decode.start_ns <= decode.end_ns <= engine.end_ns <= backend.end_ns
    assert any(e.name == "gen_ai.first_token" for e in engine.events)


def test_an_embedded_deployment_runs_the_engine_under_its_attempt(rig: Rig) -> None:
    trace_id = "9" * 32
    rig.client(rig.local_router, BACKEND_KEY).chat.completions.create(
        model="local", messages=[{"role": "user", "content": "Name a tree."}], max_tokens=4, temperature=0,
        extra_headers={"traceparent": f"00-{trace_id}-{'1' * 16}-01"},
    )
    spans = rig.trace(trace_id, expect=8)
    (root,) = [s for s in spans if s.kind == "server"]
    assert root.attrs["gen_ai.response.model"] == "local" and root.attrs["smolgate.deployment"] == "embedded"
    (router,) = _children(spans, root)
    (attempt,) = _children(spans, router)
    assert attempt.name == "chat local" and attempt.attrs["smolgate.deployment.kind"] == "embedded"
    assert "server.address" not in attempt.attrs
    cache, engine = _children(spans, attempt)
    assert cache.name == "cache.lookup" and engine.name == f"engine {MODEL}"
    assert [s.name for s in _children(spans, engine)] == ["engine.queue", "engine.prefill", "engine.decode"]


def test_every_generating_endpoint_has_the_genai_attributes(rig: Rig) -> None:
    client = rig.client(rig.backend, BACKEND_KEY)
    calls = {
        "text_completion": lambda h: client.completions.create(model=MODEL, prompt="Once upon", max_tokens=3, extra_headers=h),
        "chat": lambda h: client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=16, extra_headers=h),
    }
    for trace_id, (operation, call) in zip(("ab" * 16, "cd" * 16), calls.items(), strict=True):
        call({"traceparent": f"00-{trace_id}-{'2' * 16}-01"})
        (root,) = [s for s in rig.trace(trace_id, expect=2) if s.kind == "server"]
        a = root.attrs
        assert a["gen_ai.operation.name"] == operation and a["gen_ai.request.model"] == MODEL
        assert a["gen_ai.response.model"] == MODEL and a["http.response.status_code"] == 200
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.request.max_tokens"] in (3, 16)


def test_an_upstream_that_cannot_be_reached_says_why(rig: Rig) -> None:
    trace_id = "0f" * 16
    raw = rig.client(rig.router, ROUTER_KEY).chat.completions.with_raw_response.create(
        model="dead", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
        extra_headers={"traceparent": f"00-{trace_id}-{'3' * 16}-01"},
    )
    assert raw.headers["x-smolgate-model"] == "smollm"
    spans = rig.trace(trace_id, roots=2, expect=8)
    failed = [s for s in spans if s.name == "chat dead"]
    assert len(failed) == 2 and all(s.error and s.attrs["error.type"] == "ConnectError" for s in failed)
    assert all("http.response.status_code" not in s.attrs for s in failed)


def test_a_streamed_answer_has_its_first_token_event_and_engine_phases(rig: Rig) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    stream = rig.client(rig.backend, BACKEND_KEY).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_headers={"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None
    spans = rig.trace(trace_id, expect=6)
    (root,) = [s for s in spans if s.kind == "server"]
    assert root.attrs["gen_ai.request.stream"] is True and root.attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens
    (event,) = [e for e in root.events if e.name == "gen_ai.first_token"]
    ttft = event.attrs["gen_ai.response.time_to_first_chunk"]
    assert ttft > 0 and abs(root.start_ns + ttft * 1e9 - event.time_ns) < 1e6
    assert event.time_ns < root.end_ns
    (engine,) = [s for s in spans if s.name == f"engine {MODEL}"]
    assert {s.name for s in _children(spans, engine)} == {"engine.queue", "engine.prefill", "engine.decode"}


def test_a_cached_answer_has_a_hit_and_no_engine_span(rig: Rig) -> None:
    ids = ["1" * 32, "2" * 32]
    for trace_id in ids:
        rig.client(rig.backend, BACKEND_KEY).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say yes."}], max_tokens=4, temperature=0,
            extra_headers={"traceparent": f"00-{trace_id}-{'3' * 16}-01"},
        )
    miss, hit = rig.trace(ids[0], expect=6), rig.trace(ids[1], expect=2)
    assert {s.name for s in miss} >= {"cache.lookup", f"engine {MODEL}"}
    (lookup,) = [s for s in hit if s.name == "cache.lookup"]
    assert lookup.attrs["smolgate.cache.result"] == "hit"
    assert not [s for s in hit if s.name.startswith("engine")]
    (root,) = [s for s in hit if s.kind == "server"]
    assert root.attrs["smolgate.cache.result"] == "hit"


def test_without_a_traceparent_a_request_starts_its_own_trace(rig: Rig) -> None:
    raw = rig.client(rig.backend, BACKEND_KEY).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi."}], max_tokens=2, temperature=0
    )
    request_id = raw.headers["x-request-id"]

    def done(spans: list[ExportedSpan]) -> bool:
        return any(s.attrs.get("smolgate.request_id") == request_id for s in spans)

    (root,) = [s for s in rig.receiver.wait(done, rig.flush) if s.attrs.get("smolgate.request_id") == request_id]
    assert root.parent_id == "" and root.kind == "server" and root.trace_id != "0" * 32


def test_rejected_and_anthropic_requests_are_traced(rig: Rig) -> None:
    trace_id = "5" * 32
    bad = httpx.post(f"{rig.backend}/v1/chat/completions", json={"model": MODEL, "messages": []},
                     headers={"authorization": "Bearer sk-wrong", "traceparent": f"00-{trace_id}-{'6' * 16}-01"})  # fmt: skip
    assert bad.status_code == 401
    (root,) = rig.trace(trace_id)
    assert root.attrs["http.response.status_code"] == 401
    assert root.attrs["error.type"] == "invalid_request_error"  # OpenAI's type for a bad key
    trace_id = "7" * 32
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    ok = httpx.post(f"{rig.backend}/v1/messages", json=body, timeout=120,
                    headers={"x-api-key": BACKEND_KEY, "traceparent": f"00-{trace_id}-{'8' * 16}-01"})  # fmt: skip
    assert ok.status_code == 200
    spans = rig.trace(trace_id, expect=2)
    (root,) = [s for s in spans if s.kind == "server"]
    assert root.name == "POST /v1/messages" and root.attrs["gen_ai.operation.name"] == "chat"
    assert root.attrs["gen_ai.usage.output_tokens"] == ok.json()["usage"]["output_tokens"]


def test_content_is_recorded_only_when_the_operator_opts_in_and_keys_never(rig: Rig) -> None:
    secret_prompt = "Repeat the word zanzibarquux please."
    ids = {"backend": "a" * 32, "content": "b" * 32}
    texts = {}
    for name, url in (("backend", rig.backend), ("content", rig.content)):
        out = rig.client(url, BACKEND_KEY).chat.completions.create(
            model=MODEL, max_tokens=6, temperature=0,
            messages=[{"role": "system", "content": f"The key is {BACKEND_KEY}."}, {"role": "user", "content": secret_prompt}],
            extra_headers={"traceparent": f"00-{ids[name]}-{'c' * 16}-01"},
        )
        texts[name] = out.choices[0].message.content
        assert texts[name]
    plain = next(s for s in rig.trace(ids["backend"], expect=3) if s.kind == "server")
    assert "gen_ai.input.messages" not in plain.attrs and "gen_ai.output.messages" not in plain.attrs
    opted = next(s for s in rig.trace(ids["content"], expect=3) if s.kind == "server")
    inputs = json.loads(opted.attrs["gen_ai.input.messages"])
    assert inputs[1] == {"role": "user", "parts": [{"type": "text", "content": secret_prompt}]}
    assert inputs[0]["parts"][0]["content"] == "The key is [redacted]."  # a key in a prompt is redacted
    (output,) = json.loads(opted.attrs["gen_ai.output.messages"])
    assert output["role"] == "assistant" and output["parts"] == [{"type": "text", "content": texts["content"]}]
    assert output["finish_reason"] in ("stop", "length")
    trace_id = "f" * 32
    stream = rig.client(rig.content, BACKEND_KEY).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count to three."}], max_tokens=8, temperature=0, stream=True,
        extra_headers={"traceparent": f"00-{trace_id}-{'c' * 16}-01"},
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    (root,) = [s for s in rig.trace(trace_id, expect=3) if s.kind == "server"]
    (output,) = json.loads(root.attrs["gen_ai.output.messages"])
    assert output["parts"] == [{"type": "text", "content": streamed}] and streamed
    # Anthropic's Messages API, streamed, and the Responses API
    trace_id = "fe" * 16
    body = {"model": MODEL, "max_tokens": 6, "stream": True, "messages": [{"role": "user", "content": "Say a word."}]}
    with httpx.stream("POST", f"{rig.content}/v1/messages", json=body, timeout=120,
                      headers={"x-api-key": BACKEND_KEY, "traceparent": f"00-{trace_id}-{'c' * 16}-01"}) as events:
        lines = [line for line in events.iter_lines() if line.startswith("data:")]
    deltas = [json.loads(line[5:]) for line in lines]
    text = "".join(d["delta"].get("text", "") for d in deltas if d["type"] == "content_block_delta")
    stop = next(d["delta"]["stop_reason"] for d in deltas if d["type"] == "message_delta")
    (root,) = [s for s in rig.trace(trace_id, expect=3) if s.kind == "server"]
    assert json.loads(root.attrs["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": stop}]
    assert json.loads(root.attrs["gen_ai.input.messages"])[0]["parts"][0]["content"] == "Say a word."
    # Messages, not streamed: the chat answer it was built from (in process) is not counted a second time
    trace_id = "fd" * 16
    message = httpx.post(f"{rig.content}/v1/messages", json={**body, "stream": False}, timeout=120,
                         headers={"x-api-key": BACKEND_KEY, "traceparent": f"00-{trace_id}-{'c' * 16}-01"}).json()
    (root,) = [s for s in rig.trace(trace_id, expect=3) if s.kind == "server"]
    parts = [{"type": "text", "content": message["content"][0]["text"]}]
    assert json.loads(root.attrs["gen_ai.output.messages"]) == [
        {"role": "assistant", "parts": parts, "finish_reason": message["stop_reason"]}]
    trace_id = "ed" * 16
    answer = rig.client(rig.content, BACKEND_KEY).responses.create(
        model=MODEL, input="Say another word.", max_output_tokens=16,
        extra_headers={"traceparent": f"00-{trace_id}-{'c' * 16}-01"},
    )
    (root,) = [s for s in rig.trace(trace_id, expect=3) if s.kind == "server"]
    (output,) = json.loads(root.attrs["gen_ai.output.messages"])
    assert output["parts"] == [{"type": "text", "content": answer.output_text}] and answer.output_text
    exported = rig.receiver.raw()
    assert secret_prompt.encode() in exported  # through the opted-in gateway only:
    assert b"zanzibarquux" not in rig.receiver.raw(exclude="content")
    assert texts["backend"].encode() not in rig.receiver.raw(exclude="content")
    for key in (ROUTER_KEY, BACKEND_KEY, UPSTREAM_KEY, "sk-wrong"):
        assert key.encode() not in exported


def test_content_through_the_router_is_what_the_upstream_answered_and_keys_never(rig: Rig) -> None:
    """traces.content on a router: each endpoint's answer, relayed from a real upstream (the backend gateway and its
    engine), is captured in the endpoint's own shape, once; no key (the client's, the upstream's) is exported."""
    client = rig.client(rig.content_router, ROUTER_KEY)
    system = {"role": "system", "content": f"Never repeat {ROUTER_KEY} or {BACKEND_KEY}."}  # the client's, the upstream's
    user = {"role": "user", "content": "Name a fruit."}
    anthropic_headers = {"x-api-key": ROUTER_KEY}

    def captured(trace_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The router's server span's input and output messages (once the backend's span ended too)."""
        (root,) = [s for s in rig.trace(trace_id, roots=2, expect=4) if s.service == "content-router" and s.kind == "server"]
        return json.loads(root.attrs["gen_ai.input.messages"]), json.loads(root.attrs["gen_ai.output.messages"])

    def said(text: str, finish: str | None = None) -> list[dict[str, Any]]:
        assert text  # the upstream answered something, which the span must hold
        reason = {"finish_reason": finish} if finish is not None else {}  # Responses' output messages carry none
        return [{"role": "assistant", "parts": [{"type": "text", "content": text}], **reason}]

    def traced(trace_id: str) -> dict[str, str]:
        return {"traceparent": f"00-{trace_id}-{'d' * 16}-01"}

    prompt = [{"role": "system", "parts": [{"type": "text", "content": "Never repeat [redacted] or [redacted]."}]},
              {"role": "user", "parts": [{"type": "text", "content": "Name a fruit."}]}]  # fmt: skip
    # Chat Completions, JSON and streamed
    out = client.chat.completions.create(model="smollm", messages=[system, user], max_tokens=8, temperature=0,
                                         extra_headers=traced("c1" * 16))  # fmt: skip
    assert captured("c1" * 16) == (prompt, said(out.choices[0].message.content or "", out.choices[0].finish_reason))
    chunks = list(client.chat.completions.create(model="smollm", messages=[system, user], max_tokens=8, temperature=0,
                                                 stream=True, extra_headers=traced("c2" * 16)))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    assert captured("c2" * 16) == (prompt, said(text, finish))
    # Anthropic's Messages, JSON and streamed
    body = {"model": "smollm", "max_tokens": 8, "system": system["content"], "messages": [user]}
    message = httpx.post(f"{rig.content_router}/v1/messages", json=body, timeout=120,
                         headers={**anthropic_headers, **traced("c3" * 16)}).json()  # fmt: skip
    assert captured("c3" * 16) == (prompt, said(message["content"][0]["text"], message["stop_reason"]))
    with httpx.stream("POST", f"{rig.content_router}/v1/messages", json={**body, "stream": True}, timeout=120,
                      headers={**anthropic_headers, **traced("c4" * 16)}) as events:
        deltas = [json.loads(line[5:]) for line in events.iter_lines() if line.startswith("data:")]
    text = "".join(d["delta"].get("text", "") for d in deltas if d["type"] == "content_block_delta")
    stop = next(d["delta"]["stop_reason"] for d in deltas if d["type"] == "message_delta")
    assert captured("c4" * 16) == (prompt, said(text, stop))
    # the Responses API, JSON and streamed
    inputs = [{"role": "system", "content": system["content"]}, user]
    answer = client.responses.create(model="smollm", input=inputs, max_output_tokens=16,  # type: ignore[arg-type]
                                     extra_headers=traced("c5" * 16))  # fmt: skip
    assert captured("c5" * 16) == (prompt, said(answer.output_text))
    streamed = client.responses.create(model="smollm", input=inputs, max_output_tokens=16, stream=True,  # type: ignore[arg-type]
                                       extra_headers=traced("c6" * 16))  # fmt: skip
    text = "".join(e.delta for e in streamed if e.type == "response.output_text.delta")
    assert captured("c6" * 16) == (prompt, said(text))
    exported = rig.receiver.raw()
    assert text.encode() in exported
    for key in (ROUTER_KEY, BACKEND_KEY, UPSTREAM_KEY):
        assert key.encode() not in exported


def test_untraced_router_passes_the_clients_traceparent_on_unchanged(rig: Rig) -> None:
    rig.fake.play(default="ok")
    rig.client(rig.plain_router, ROUTER_KEY).chat.completions.create(
        model="flaky", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, extra_headers={"traceparent": TRACEPARENT}
    )
    assert rig.fake.headers[-1]["traceparent"] == TRACEPARENT


def test_python_m_gateway_exports_when_the_otel_endpoint_variable_is_set(rig: Rig, tmp_path: Path) -> None:
    """The production wiring: `python -m gateway` (a torch-free router to the fault-injecting upstream) with only
    OpenTelemetry's standard variables set exports to the receiver, including what is queued at SIGTERM."""
    rig.fake.play(default="ok")
    config = tmp_path / "gw.yaml"
    upstream = rig.fake_url + "/v1"
    gateway = {"api_keys": [ROUTER_KEY], "embeddings": False, "cache": {"backend": "off"}, "batches": {"enabled": False},
               "models": {"m": {"deployments": [{"kind": "openai", "base_url": upstream}]}}}  # fmt: skip
    config.write_text(yaml.safe_dump(gateway))
    port = free_port()
    env = {**os.environ, "SMOLGATE_CONFIG": str(config), "SMOLGATE_ACCESS_LOG": "false", "OTEL_SERVICE_NAME": "subprocess",
           "OTEL_EXPORTER_OTLP_ENDPOINT": rig.receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "60000"}  # fmt: skip
    log = tmp_path / "gw.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port)], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, 120, log)
        trace_id = "0123456789abcdef" * 2
        rig.client(f"http://127.0.0.1:{port}", ROUTER_KEY).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
            extra_headers={"traceparent": f"00-{trace_id}-{'4' * 16}-01"},
        )
    finally:
        stop_processes([proc])  # the batch processor waits 60 s between exports: only the shutdown flush sends them
    spans = rig.trace(trace_id, expect=3)
    assert {s.service for s in spans} == {"subprocess"}
    assert {s.name for s in spans} == {"POST /v1/chat/completions", "router m", "chat m"}


# ---- configuration ------------------------------------------------------------------------------------------------


def test_tracing_is_off_without_an_endpoint_and_loads_nothing() -> None:
    config = GatewayConfig()
    assert build_tracing(config) is None
    app = create_app(build_context(config, None, None), manage_engine=False)
    assert not any(m.cls is TracingMiddleware for m in app.user_middleware)
    assert app.state.ctx.tracing is None


def test_every_engine_of_a_models_list_is_wrapped_once() -> None:
    """With several embedded models (`models:` as a list), each engine gets its engine spans, and the first model's
    entry stays the same object as `engine` (the context and the lifespan tell them apart by identity)."""
    from gateway.app import _traced_engines
    from gateway.client import NoEngine
    from gateway.tracing.engine import TracedEngine

    first, second = NoEngine(), NoEngine()
    tracing = build_tracing(from_mapping({"traces": {"endpoint": "http://127.0.0.1:9/v1/traces"}}))
    assert tracing is not None
    engine, engines = _traced_engines(tracing, first, {"a": first, "b": second})
    assert isinstance(engine, TracedEngine) and engines["a"] is engine and engine.inner is first
    assert isinstance(engines["b"], TracedEngine) and engines["b"].inner is second
    tracing.shutdown(0.1)


def test_the_standard_otel_variables_configure_it() -> None:
    cfg = apply_env(GatewayConfig(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_SERVICE_NAME": "gw",
                                      "SMOLGATE_TRACES_CONTENT": "true"})  # fmt: skip
    assert cfg.traces == TracesConfig(endpoint="http://collector:4318/v1/traces", service_name="gw", content=True)
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:4318/traces"}
    assert apply_env(GatewayConfig(), both).traces.endpoint == "http://b:4318/traces"
    assert apply_env(GatewayConfig(), {**both, "OTEL_SDK_DISABLED": "true"}).traces.enabled is False
    assert from_mapping({"traces": {"content": True}}).traces.content is True
    with pytest.raises(ConfigError, match="unknown traces config keys"):
        from_mapping({"traces": {"contents": True}})
    with pytest.raises(ConfigError, match="http"):
        from_mapping({"traces": {"endpoint": "collector:4318"}})


def test_a_caller_that_does_not_sample_gets_no_spans(rig: Rig) -> None:
    """The sampled flag of the incoming traceparent is honoured (the SDK's default parent-based sampler)."""
    quiet, loud = "d" * 32, "e" * 32
    for trace_id, flags in ((quiet, "00"), (loud, "01")):
        out = rig.client(rig.backend, BACKEND_KEY).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Hello there, {flags}."}], max_tokens=3, temperature=0,
            extra_headers={"traceparent": f"00-{trace_id}-{'f' * 16}-{flags}"},
        )
        assert out.choices[0].message.content
    assert rig.trace(loud, expect=5)  # exported after the unsampled request ended
    assert not [s for s in rig.receiver.snapshot() if s.trace_id == quiet]


def test_output_messages_count_only_the_endpoints_own_shape() -> None:
    """Messages and Responses run the chat pipeline in process: the chat answer they were built from was sent to
    them, not to the client, and is not the endpoint's output."""
    chat = {"object": "chat.completion", "choices": [{"index": 0, "message": {"content": "Hi"}, "finish_reason": "stop"}]}
    message = {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn"}
    out = json.loads(genai.output_messages([chat, message], "/v1/messages", 100) or "null")
    assert out == [{"role": "assistant", "parts": [{"type": "text", "content": "Hi"}], "finish_reason": "end_turn"}]
    out = json.loads(genai.output_messages([chat, message], "/v1/chat/completions", 100) or "null")
    assert out == [{"role": "assistant", "parts": [{"type": "text", "content": "Hi"}], "finish_reason": "stop"}]
    assert genai.output_messages([chat], "/v1/responses", 100) is None
