"""Faults at the HTTP edge, against the real engine behind live servers: an engine step that raises,
Redis restarting under traffic, a client that sends its body too slowly, one that never reads its stream."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import orjson
import pytest
import uvicorn
from cache_fixtures import REDIS_SKIP, free_port, start_redis
from gateway_fixtures import API_KEY, LiveStack, gateway_test_config, live  # noqa: F401

from gateway.app import build_context, create_app
from gateway.cache.config import CacheConfig
from gateway.config import GatewayConfig

STORY = [{"role": "user", "content": "Tell me a long story."}]


class AppServer:
    """One more app over the session's real engine, on its own uvicorn thread (the engine is not managed)."""

    def __init__(self, config: GatewayConfig, engine: Any) -> None:
        self.app = create_app(build_context(config, engine, None, log_sink=open("/dev/null", "w")), manage_engine=False)  # noqa: SIM115
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=asyncio.run, args=(self.server.serve(sockets=[sock]),), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the fault server did not start"
            time.sleep(0.05)

    @property
    def stats(self) -> Any:
        return self.app.state.ctx.stats

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


# ---- an engine step that raises ---------------------------------------------------------------------


def test_a_failing_engine_step_fails_only_its_requests(live: LiveStack, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    llm = live.engine.engine
    real_step = llm.step
    armed = threading.Event()

    def flaky_step() -> Any:  # fault injection: the next step after arming raises, once
        if armed.is_set():
            armed.clear()
            raise RuntimeError("injected engine fault")
        return real_step()

    monkeypatch.setattr(llm, "step", flaky_step)
    client = live.client()
    results: dict[str, Any] = {}
    first_chunk = threading.Event()

    def stream() -> None:
        try:
            for _ in client.chat.completions.create(
                model="gpt-4o-mini", messages=STORY, max_tokens=400, stream=True, extra_body={"ignore_eos": True}
            ):
                first_chunk.set()
            results["stream"] = "finished"
        except openai.APIError as exc:
            results["stream"] = exc

    def plain() -> None:
        try:
            client.chat.completions.create(model="gpt-4o-mini", messages=STORY, max_tokens=400, extra_body={"ignore_eos": True})
            results["plain"] = "finished"
        except openai.APIStatusError as exc:
            results["plain"] = exc

    threads = [threading.Thread(target=stream), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    assert first_chunk.wait(60)
    _wait(lambda: live.engine.stats().num_running >= 2, 60, "both requests to run")
    armed.set()
    for t in threads:
        t.join(120)
    assert isinstance(results["stream"], openai.APIError) and not isinstance(results["stream"], openai.APIStatusError)
    assert "server" in str(results["stream"]).lower() or "internal" in str(results["stream"]).lower()
    assert isinstance(results["plain"], openai.InternalServerError) and results["plain"].status_code == 500
    assert "injected" not in str(results["plain"].body)  # internal details never leak
    # The engine keeps serving, and the failed requests freed their KV blocks.
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert resp.choices[0].finish_reason in ("stop", "length")
    assert live.wait_idle().kv_blocks_used == 0


# ---- clients that hold on ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def impatient(live: LiveStack) -> Iterator[AppServer]:  # noqa: F811
    server = AppServer(replace(gateway_test_config(), body_timeout_s=1.0, stream_send_timeout_s=1.0), live.engine)
    yield server
    server.stop()


def _rest_of_response(sock: socket.socket, got: bytes) -> bytes:
    """Read until the response's head and Content-Length bytes of body are in (or the server closes)."""
    more = b""
    while True:
        data = got + more
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(body) >= length:
                return more
        chunk = sock.recv(4096)
        if not chunk:
            return more
        more += chunk


def test_a_slow_body_gets_408_and_lets_go(impatient: AppServer) -> None:
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", impatient.port), timeout=10) as sock:
        sock.sendall(head)
        reply = b""
        for byte in body[:-1]:  # a byte every 0.2 s: the whole body would take seconds
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            sock.settimeout(0.2)
            try:
                reply += sock.recv(4096)
                break
            except TimeoutError:
                continue
        sock.settimeout(10)
        reply += _rest_of_response(sock, reply)  # the head and the JSON body may come in separate packets
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"request_timeout" in reply
    assert time.monotonic() - began < 8
    _wait(lambda: impatient.stats.in_flight == 0, 10, "the request to be let go")


async def test_a_client_that_never_reads_its_stream_is_let_go(live: LiveStack) -> None:  # noqa: F811
    """The app under an ASGI `send` that stops returning after the first event, as a socket does once a client
    that reads nothing has filled every buffer (loopback buffers are megabytes: a real socket takes too long)."""
    config = replace(gateway_test_config(), stream_send_timeout_s=1.0, cache=CacheConfig(backend="off"))
    app = create_app(build_context(config, live.engine, None, log_sink=open("/dev/null", "w")), manage_engine=False)  # noqa: SIM115
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": STORY, "max_tokens": 400, "ignore_eos": True, "stream": True})
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
        "headers": [(b"authorization", f"Bearer {API_KEY}".encode()), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
    }  # fmt: skip
    sent: list[dict[str, Any]] = []
    never = asyncio.Event()
    bodies = iter([{"type": "http.request", "body": body, "more_body": False}])

    async def receive() -> dict[str, Any]:
        message = next(bodies, None)
        if message is None:
            await never.wait()  # the client stays connected
        return message  # type: ignore[return-value]

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            await never.wait()  # the client reads nothing more

    began = time.monotonic()
    await asyncio.wait_for(app(scope, receive, send), timeout=60)
    assert time.monotonic() - began < 30
    assert sent[0]["status"] == 200 and app.state.ctx.stats.in_flight == 0
    assert live.wait_idle().kv_blocks_used == 0  # the abandoned request was aborted, its blocks freed


def test_past_the_concurrency_limit_requests_get_429_with_retry_after(live: LiveStack) -> None:  # noqa: F811
    server = AppServer(replace(gateway_test_config(), max_concurrent_requests=1, retry_after_s=2), live.engine)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": "gpt-4o-mini", "messages": STORY, "max_tokens": 24, "ignore_eos": True}
    try:
        url = f"{server.url}/v1/chat/completions"
        first = threading.Thread(target=httpx.post, args=(url,), kwargs={"json": body, "headers": headers, "timeout": 60})
        first.start()
        _wait(lambda: server.stats.in_flight == 1, 30, "the first request")
        turned_away = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers)
        assert turned_away.status_code == 429 and turned_away.headers["retry-after"] == "2"
        assert turned_away.json()["error"]["type"] == "rate_limit_error"
        assert httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 200  # reads are not limited
        first.join(60)
        again = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "max_tokens": 2}, headers=headers, timeout=60)
        assert again.status_code == 200  # recovered
        assert httpx.get(f"{server.url}/v1/stats", headers=headers).json()["requests"]["rejected_429"] == 1
    finally:
        server.stop()


# ---- Redis restarting under traffic -----------------------------------------------------------------


def test_redis_restarting_under_traffic_loses_no_request(live: LiveStack) -> None:  # noqa: F811
    redis = start_redis()
    if redis is None:
        pytest.skip(REDIS_SKIP)
    port = int(redis.url.rsplit(":", 1)[1].split("/")[0])
    cache = CacheConfig(backend="redis", redis_url=redis.url, key_prefix=f"f{free_port()}", redis_retry_s=0.2)
    server = AppServer(replace(gateway_test_config(), cache=cache), live.engine)
    statuses: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        i = 0
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            while not stop.is_set():
                msg = {"role": "user", "content": f"Say {i % 4}."}
                body = {"model": "gpt-4o-mini", "messages": [msg], "max_tokens": 3, "temperature": 0}
                statuses.append(http.post(f"{server.url}/v1/chat/completions", json=body).status_code)
                i += 1

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        _wait(lambda: len(statuses) >= 4, 60, "traffic with Redis up")
        redis.stop()
        seen = len(statuses)
        _wait(lambda: len(statuses) >= seen + 4, 60, "traffic with Redis down")
        redis = start_redis(port)  # a restart: the same port, the data gone
        assert redis is not None
        seen = len(statuses)
        _wait(lambda: len(statuses) >= seen + 8, 60, "traffic after the restart")
        stop.set()
        worker.join(60)
        assert statuses and set(statuses) == {200}, statuses
        # The restarted (empty) Redis is used again: the answers are stored and hit once more.
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            msg = {"role": "user", "content": "Say 1."}
            body = {"model": "gpt-4o-mini", "messages": [msg], "max_tokens": 3, "temperature": 0}
            _wait(lambda: http.post(f"{server.url}/v1/chat/completions", json=body).headers["x-cache"] == "hit", 20, "a hit")
    finally:
        stop.set()
        worker.join(60)
        server.stop()
        redis.stop()

