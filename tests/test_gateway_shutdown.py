"""Graceful shutdown of a real `python -m gateway` process: on SIGTERM it stops accepting, lets the requests
in flight (a stream and a plain request) finish, then exits; past the drain timeout it stops anyway."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from bench.server import SMALL_SERVER_ENV, GatewayProcess

LONG_STORY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Tell me a long story."}], "ignore_eos": True}


def _stream(url: str, max_tokens: int, first_chunk: threading.Event, out: dict[str, Any]) -> None:
    """Read a whole SSE stream: its data events, and whether it ended with [DONE]."""
    events: list[Any] = []
    try:
        body = {**LONG_STORY, "max_tokens": max_tokens, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as resp:
            out["status"] = resp.status_code
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first_chunk.set()
                elif line.startswith("event: error"):
                    out["error_event"] = True
    except httpx.HTTPError as exc:
        out["transport_error"] = repr(exc)
    finally:
        first_chunk.set()
        out["events"] = events


def _post(url: str, max_tokens: int, out: dict[str, Any]) -> None:
    try:
        resp = httpx.post(f"{url}/v1/chat/completions", json={**LONG_STORY, "max_tokens": max_tokens}, timeout=120)
        out["status"], out["body"] = resp.status_code, resp.json()
    except httpx.HTTPError as exc:
        out["transport_error"] = repr(exc)


@pytest.fixture(scope="module")
def servers() -> Any:
    """Two servers, started side by side: a 60 s drain and a 1 s drain."""
    started: dict[str, GatewayProcess] = {}

    def start(name: str, drain: str) -> None:
        started[name] = GatewayProcess.start({**SMALL_SERVER_ENV, "SMOLGATE_DRAIN_TIMEOUT_S": drain})

    threads = [threading.Thread(target=start, args=a) for a in (("patient", "60"), ("hasty", "1"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(started) == {"patient", "hasty"}, "a gateway process did not start"
    yield started
    for server in started.values():
        server.kill()


def test_sigterm_lets_in_flight_requests_finish(servers: dict[str, GatewayProcess]) -> None:
    server = servers["patient"]
    first, stream_out, post_out = threading.Event(), {}, {}  # type: ignore[var-annotated]
    reader = threading.Thread(target=_stream, args=(server.url, 40, first, stream_out))
    poster = threading.Thread(target=_post, args=(server.url, 32, post_out))
    reader.start()
    poster.start()
    assert first.wait(60), "the stream did not start"
    server.terminate()
    time.sleep(0.5)
    with pytest.raises(httpx.TransportError):  # no longer accepting
        httpx.get(f"{server.url}/health", timeout=2)
    reader.join(120)
    poster.join(120)
    rc = server.wait(60)
    assert rc in (0, -signal.SIGTERM), server.log()[-2000:]  # uvicorn re-raises the signal once done
    # The stream was answered in full: every token, the final chunk, then [DONE].
    assert stream_out["status"] == 200 and "error_event" not in stream_out and "transport_error" not in stream_out
    assert stream_out["events"][-1] == "[DONE]"
    chunks = [json.loads(e) for e in stream_out["events"][:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert sum(bool(c["choices"] and c["choices"][0]["delta"].get("content")) for c in chunks) >= 36
    # So was the plain request.
    assert post_out["status"] == 200, post_out
    assert post_out["body"]["usage"]["completion_tokens"] == 32
    assert "Application shutdown complete" in server.log()


def test_drain_timeout_bounds_the_shutdown(servers: dict[str, GatewayProcess]) -> None:
    server = servers["hasty"]
    first, out = threading.Event(), {}  # type: ignore[var-annotated]
    reader = threading.Thread(target=_stream, args=(server.url, 1000, first, out))
    reader.start()
    assert first.wait(60), "the stream did not start"
    began = time.monotonic()
    server.terminate()
    rc = server.wait(60)
    took = time.monotonic() - began
    reader.join(30)
    assert rc in (0, -signal.SIGTERM), server.log()[-2000:]  # uvicorn re-raises the signal once done
    assert took < 30, f"shutdown took {took:.1f} s with a 1 s drain timeout"
    assert out["events"][-1:] != ["[DONE]"]  # a 1000-token story cannot finish within 1 s: it was cut
