"""Issue 23 (docs/security.md): keys, limits and priorities hold on every path. Each test is one finding, probed as a
client with a restricted key would, through real HTTP servers: gateway apps under uvicorn on the session's REAL
engine (SmolLM2), fake OpenAI-compatible upstreams (tests/routing_fixtures.py: a real HTTP server each), and for the
startup and replica findings real `python -m gateway` processes (and a real redis-server).

After every test the engine holds no more KV blocks than before it (no attack leaks one).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gateway_fixtures
import httpx
import openai
import pytest
import yaml
from cache_fixtures import REDIS_SKIP, free_port, start_redis
from gateway_fixtures import LiveStack, gateway_test_config
from routing_fixtures import FakeUpstream, Servers
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from bench.server import stop_processes, wait_ready
from gateway.app import build_context, create_app
from gateway.config import from_mapping

live = gateway_fixtures.live
ROOT = Path(__file__).resolve().parents[1]

ALL = "sk-sec-all-models-0123456789"  # a plain key: every model, the default limits
NARROW = "sk-sec-narrow-cheap-and-auto-0123"
AUTO_ONLY = "sk-sec-only-auto-0123456789"
FLAKY_ONLY = "sk-sec-only-flaky-0123456789"
URGENT = "sk-sec-urgent-priority-0123456"  # may ask for priority -5
EMBED_ONLY = "sk-sec-embedding-model-only-0123"
LIMITED = "sk-sec-two-requests-a-minute-01"
TPM = "sk-sec-five-tokens-a-minute-0123"
HASHED = "sk-sec-configured-only-as-a-hash-0123"  # the config holds sha256:<hex> of it
ADMIN = "sk-sec-admin-operator-0123456789"
UPSTREAM_SECRET = "sk-upstream-secret-never-shown-0123456789"
SECRETS = (ALL, NARROW, AUTO_ONLY, FLAKY_ONLY, URGENT, EMBED_ONLY, LIMITED, TPM, HASHED, ADMIN, UPSTREAM_SECRET)
HARD = "Prove step by step that the algorithm's complexity is O(n log n), then derive the integral of x^2."
MSG = [{"role": "user", "content": "Name a color."}]
CAP = 8  # key_defaults.max_tokens of these servers
SEQUENCES = 4  # key_defaults.max_sequences


def _sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _echo_app() -> Starlette:
    """An upstream that rejects every request, quoting the credentials it was sent (some servers do)."""

    async def reject(request: Request) -> JSONResponse:
        said = f"Invalid request; you sent authorization '{request.headers.get('authorization')}'."
        return JSONResponse({"error": {"message": said, "type": "invalid_request_error", "param": None, "code": None}}, 400)

    return Starlette(routes=[Route("/v1/chat/completions", reject, methods=["POST"])])


def _routed(urls: dict[str, str]) -> dict[str, Any]:
    def dep(name: str) -> dict[str, Any]:
        return {"kind": "openai", "name": name, "base_url": f"{urls[name]}/v1", "timeout_s": 5.0}

    return {
        "embeddings": False,
        "models": {
            "cheap": {"deployments": [dep("cheap")]},
            "premium": {"deployments": [dep("premium")]},
            "flaky": {"deployments": [dep("flaky")]},
            "local": {"deployments": [{"kind": "embedded"}]},
            "echo": {"deployments": [{**dep("echo"), "api_key_env": "SEC_UPSTREAM_KEY"}]},
        },
        "fallbacks": {"flaky": ["premium", "cheap"]},
        "auto": {"small": "cheap", "large": "premium", "threshold": 0.4, "use_embeddings": False},
        "router": {"num_retries": 0, "backoff_base_s": 0.01, "cooldown_failures": 100},
        "key_defaults": {"max_tokens": CAP, "max_sequences": SEQUENCES},
        "api_keys": [
            ALL,
            {"key": NARROW, "name": "narrow", "models": ["cheap", "auto", "flaky", "echo"]},
            {"key": AUTO_ONLY, "name": "auto-only", "models": ["auto"]},
            {"key": FLAKY_ONLY, "name": "flaky-only", "models": ["flaky"]},
        ],
        "admin_keys": [ADMIN],
    }


def _embedded() -> dict[str, Any]:
    """The embedded engine alone: no `models` section."""
    return {
        "embeddings": False,
        "key_defaults": {"max_tokens": CAP, "max_sequences": SEQUENCES},
        "api_keys": [
            ALL,
            _sha(HASHED),
            {"key": URGENT, "name": "urgent", "priority": -5},
            {"key": EMBED_ONLY, "name": "embed-only", "models": ["all-MiniLM-L6-v2"]},
            {"key": LIMITED, "name": "limited", "models": ["gpt-4o-mini"], "rpm": 2},
            {"key": TPM, "name": "tpm", "tpm": 5},
        ],
        "admin_keys": [_sha(ADMIN)],
    }


@dataclass
class Rig:
    routed: str
    embedded: str
    fakes: dict[str, FakeUpstream]
    log_path: Path

    def client(self, key: str, url: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{url or self.routed}/v1", api_key=key, max_retries=0, timeout=120)

    def received(self) -> dict[str, int]:
        return {n: f.received for n, f in self.fakes.items()}


@pytest.fixture(scope="module")
def rig(live: LiveStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    fakes = {n: FakeUpstream(n) for n in ("cheap", "premium", "flaky")}
    fakes["flaky"].play(default="500")
    upstreams = Servers()
    urls = dict(zip([*fakes, "echo"], upstreams.start([*(f.app() for f in fakes.values()), _echo_app()]), strict=True))
    engine = gateway_test_config().engine
    routed = replace(from_mapping(_routed(urls), {"SEC_UPSTREAM_KEY": UPSTREAM_SECRET}), engine=engine)
    embedded = replace(from_mapping(_embedded(), {}), engine=engine)
    log_path = tmp_path_factory.mktemp("security") / "gateway.log"
    log = log_path.open("a", buffering=1)
    apps = [create_app(build_context(c, live.engine, None, log_sink=log), manage_engine=False) for c in (routed, embedded)]
    gateways = Servers()
    routed_url, embedded_url = gateways.start(apps)
    yield Rig(routed_url, embedded_url, fakes, log_path)
    gateways.stop()
    upstreams.stop()
    log.close()


@pytest.fixture(autouse=True)
def no_leaked_kv_blocks(live: LiveStack) -> Iterator[None]:
    before = live.wait_idle()
    yield
    after = live.wait_idle()
    free = lambda s: s.kv_blocks_total - s.kv_blocks_used  # noqa: E731
    assert free(after) == free(before), f"KV blocks leaked: {free(before)} free before, {free(after)} after"


def _chat(client: openai.OpenAI, model: str, content: str = "Name a color.", **kw: Any) -> Any:
    kw.setdefault("max_tokens", 4)
    return client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], temperature=0, **kw
    )


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    """The OpenAI error object of a failed call (and check its shape)."""
    body = exc.response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]  # type: ignore[no-any-return]


def _wait_window(margin_s: float = 15.0) -> None:
    """Fixed one-minute rate-limit windows: don't straddle one."""
    if time.time() % 60 > 60 - margin_s:
        time.sleep(61 - time.time() % 60)


# ---- 1. allow-lists hold for `auto`, fallbacks, streams and the cache ------------------------------------------


def test_auto_and_fallbacks_serve_only_models_the_key_may_use(rig: Rig) -> None:
    narrow, auto_only, flaky_only = rig.client(NARROW), rig.client(AUTO_ONLY), rig.client(FLAKY_ONLY)
    before = rig.received()
    hard = _chat(narrow, "auto", HARD)  # scored hard: `auto` would pick premium, which this key may not use
    assert (hard.headers["x-smolgate-model"], hard.headers["x-smolgate-auto-tier"]) == ("cheap", "small")
    with httpx.stream(
        "POST", f"{rig.routed}/v1/chat/completions", headers={"authorization": f"Bearer {NARROW}"},
        json={"model": "auto", "messages": [{"role": "user", "content": HARD}], "stream": True, "max_tokens": 4},
    ) as stream:  # fmt: skip
        assert stream.status_code == 200 and stream.headers["x-smolgate-model"] == "cheap"
        assert "[DONE]" in stream.read().decode()
    fell_back = _chat(narrow, "flaky")  # flaky fails; its first fallback (premium) is not this key's: cheap answers
    assert fell_back.headers["x-smolgate-model"] == "cheap"
    assert rig.received()["premium"] == before["premium"]  # premium never saw a request
    # neither of auto's models allowed: the very error an unknown / forbidden model gets, never another's answer
    with pytest.raises(openai.NotFoundError) as via_auto:
        _chat(auto_only, "auto", HARD)
    with pytest.raises(openai.NotFoundError) as direct:
        _chat(auto_only, "premium")
    assert _error(via_auto.value)["code"] == _error(direct.value)["code"] == "model_not_found"
    with pytest.raises(openai.InternalServerError) as only_flaky:  # no fallback is this key's: flaky's own failure
        _chat(flaky_only, "flaky")
    assert _error(only_flaky.value)["code"] == "all_deployments_failed" and "premium" not in only_flaky.value.message
    after = rig.received()
    assert (after["premium"], after["cheap"]) == (before["premium"], before["cheap"] + 3)
    # the embedded model, its answer cached for another key, is still not this key's; /v1/models lists its own
    _chat(rig.client(ALL), "local")
    with pytest.raises(openai.NotFoundError):
        _chat(narrow, "local")
    assert sorted(m.id for m in narrow.models.list()) == ["auto", "cheap", "echo", "flaky"]
    with pytest.raises(openai.NotFoundError):
        narrow.models.retrieve("premium")


# ---- 2. no silent empty secret --------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "   "])
def test_an_unset_or_empty_api_key_env_stops_startup(tmp_path: Path, value: str | None) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "embeddings": False, "cache": {"backend": "off"},
        "models": {"paid": {"deployments": [{"kind": "openai", "name": "paid-api", "base_url": "http://127.0.0.1:9/v1",
                                             "api_key_env": "SEC_TEST_UPSTREAM_KEY"}]}},
    }))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "SEC_TEST_UPSTREAM_KEY"}
    if value is not None:
        env["SEC_TEST_UPSTREAM_KEY"] = value
    args = [sys.executable, "-m", "gateway", "--config", str(config), "--port", str(free_port())]
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the gateway started with an empty upstream key")
    assert proc.returncode != 0
    message = err.decode()
    assert "SEC_TEST_UPSTREAM_KEY" in message and "paid-api" in message and "Traceback" not in message


# ---- 3. per-key models / rpm / tpm without a routing section, shared by replicas -------------------------------


def test_key_limits_hold_with_the_embedded_engine_alone(rig: Rig) -> None:
    url = rig.embedded
    with pytest.raises(openai.NotFoundError) as denied:  # the engine's model is not this key's
        _chat(rig.client(EMBED_ONLY, url), "gpt-4o-mini")
    assert _error(denied.value)["code"] == "model_not_found"
    _wait_window()
    limited = rig.client(LIMITED, url)
    for _ in range(2):
        _chat(limited, "gpt-4o-mini", max_tokens=1)
    with pytest.raises(openai.RateLimitError) as over:
        _chat(limited, "SmolLM2-135M-Instruct", max_tokens=1)
    assert 1 <= int(over.value.response.headers["retry-after"]) <= 60 and _error(over.value)["type"] == "rate_limit_error"
    tpm = rig.client(TPM, url)
    _chat(tpm, "gpt-4o-mini", max_tokens=1)  # more than 5 tokens with its prompt: the minute's tokens are spent
    with pytest.raises(openai.RateLimitError):
        _chat(tpm, "gpt-4o-mini", max_tokens=1)
    _chat(rig.client(ALL, url), "gpt-4o-mini", max_tokens=1)  # other keys are not limited


def test_responses_and_messages_apply_the_same_key_policy(rig: Rig) -> None:
    """/v1/responses and /v1/messages translate into chat requests: the key's models, priority ceiling and
    max_tokens cap hold on them exactly as on /v1/chat/completions."""
    url = rig.embedded
    with pytest.raises(openai.NotFoundError):  # the engine's model is not this key's
        rig.client(EMBED_ONLY, url).responses.create(model="gpt-4o-mini", input="Name a color.")
    denied = httpx.post(
        f"{url}/v1/messages",
        json={"model": "gpt-4o-mini", "max_tokens": 4, "messages": MSG},
        headers={"x-api-key": EMBED_ONLY},
        timeout=120,
    )
    assert denied.status_code == 404 and denied.json()["error"]["type"] == "not_found_error"
    plain = rig.client(ALL, url)
    with pytest.raises(openai.BadRequestError):  # jumping the queue through the Responses API
        plain.responses.create(model="gpt-4o-mini", input="Name a color.", extra_body={"priority": -1})
    with pytest.raises(openai.BadRequestError):  # over the key's max_tokens cap
        plain.responses.create(model="gpt-4o-mini", input="Name a color.", max_output_tokens=CAP + 100)
    over = httpx.post(
        f"{url}/v1/messages",
        json={"model": "gpt-4o-mini", "max_tokens": 4, "messages": MSG, "priority": -1},
        headers={"x-api-key": ALL},
        timeout=120,
    )
    assert over.status_code == 400 and over.json()["error"]["type"] == "invalid_request_error"
    ok = plain.responses.create(model="gpt-4o-mini", input="Name a color.")  # the cap is its default
    assert ok.status in ("completed", "incomplete") and ok.usage is not None and ok.usage.output_tokens <= CAP


def _spawn_gateway(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "SMOLGATE_CONFIG": str(config), "SMOLGATE_NUM_THREADS": "1"}
    out = log.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "--port", str(port)], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}"


def test_two_gateway_processes_share_a_keys_rpm_through_redis(tmp_path: Path) -> None:
    redis = start_redis()
    if redis is None:
        pytest.skip(REDIS_SKIP)
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump({  # the embedded engine alone, in each of two processes
        "embeddings": False, "cache": {"backend": "off"}, "access_log": False,
        "engine": {"max_model_len": 512, "kv_cache_memory_mb": 64},
        "api_keys": [ALL, {"key": LIMITED, "name": "limited", "rpm": 3}], "admin_keys": [ADMIN],
        "router": {"redis_url": redis.url, "redis_prefix": f"sec{free_port()}"},
    }))  # fmt: skip
    procs = [_spawn_gateway(config, tmp_path / f"gw{i}.log") for i in range(2)]
    try:
        for i, (proc, url) in enumerate(procs):
            wait_ready(url, proc, 300, tmp_path / f"gw{i}.log")
        _wait_window(20)
        clients = [openai.OpenAI(base_url=f"{url}/v1", api_key=LIMITED, max_retries=0, timeout=120) for _, url in procs]
        for i in range(3):
            _chat(clients[i % 2], "gpt-4o-mini", max_tokens=1)
        for client in clients:  # 3 a minute in all, whichever replica counts them
            with pytest.raises(openai.RateLimitError):
                _chat(client, "gpt-4o-mini", max_tokens=1)
        admin = {"authorization": f"Bearer {ADMIN}"}
        for _, url in procs:  # each engine holds no KV block afterwards
            deadline = time.monotonic() + 10
            while "smolgate_kv_cache_blocks_used 0.0" not in httpx.get(f"{url}/metrics", headers=admin).text:
                assert time.monotonic() < deadline, "a replica's engine still holds KV blocks"
                time.sleep(0.1)
    finally:
        stop_processes((proc for proc, _ in procs), timeout_s=30)
        redis.stop()


# ---- 4. priority and the cost of a request are the key's, not the client's --------------------------------------


def test_priority_is_capped_by_the_key(rig: Rig) -> None:
    plain, urgent = rig.client(ALL, rig.embedded), rig.client(URGENT, rig.embedded)
    for value in (-(2**31), -1, 2**31):  # jumping the queue, or out of range: 400 naming `priority`
        with pytest.raises(openai.BadRequestError) as err:
            _chat(plain, "gpt-4o-mini", extra_body={"priority": value})
        assert _error(err.value)["param"] == "priority"
    assert _chat(plain, "gpt-4o-mini", extra_body={"priority": 7}).parse().choices  # a later class: fine
    assert _chat(urgent, "gpt-4o-mini", extra_body={"priority": -5}).parse().choices  # its own class
    with pytest.raises(openai.BadRequestError):
        _chat(urgent, "gpt-4o-mini", extra_body={"priority": -6})
    before = rig.received()["cheap"]  # through the router to an upstream: checked before it is sent
    with pytest.raises(openai.BadRequestError):
        _chat(rig.client(NARROW), "cheap", extra_body={"priority": -1})
    assert rig.received()["cheap"] == before


def test_max_tokens_fan_out_and_min_tokens_are_capped_by_the_key(rig: Rig) -> None:
    client = rig.client(ALL, rig.embedded)
    # no max_tokens, EOS ignored: without a default cap this would hold a slot to the end of the context
    resp = client.chat.completions.create(model="gpt-4o-mini", messages=MSG, extra_body={"ignore_eos": True})
    assert resp.usage is not None and resp.usage.completion_tokens == CAP and resp.choices[0].finish_reason == "length"
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("chat", {"max_tokens": CAP + 1}, "max_tokens"),
        ("chat", {"max_completion_tokens": CAP + 1}, "max_completion_tokens"),
        ("chat", {"max_tokens": 2, "min_tokens": CAP + 1}, "min_tokens"),
        ("chat", {"min_tokens": CAP + 1}, "min_tokens"),
        ("chat", {"max_tokens": 2, "n": SEQUENCES + 1}, "n"),
        ("completions", {"max_tokens": 2, "n": SEQUENCES + 1, "best_of": SEQUENCES + 1}, "n"),
        ("completions", {"max_tokens": 2, "n": 2, "prompt": ["a", "b", "c"]}, "prompt"),
        ("chat", {"max_tokens": 2, "speculate": False}, "speculate"),  # no request field reaches speculation
    ]
    for endpoint, extra, param in cases:
        body = {"model": "gpt-4o-mini", **({"messages": MSG} if endpoint == "chat" else {"prompt": "Hi"}), **extra}
        r = httpx.post(f"{rig.embedded}/v1/{'chat/' if endpoint == 'chat' else ''}completions", json=body,
                       headers={"authorization": f"Bearer {ALL}"}, timeout=60)  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
    routed, before = rig.client(NARROW), rig.received()["cheap"]  # the same caps before a request goes upstream
    with pytest.raises(openai.BadRequestError):
        _chat(routed, "cheap", max_tokens=CAP + 1)
    assert rig.received()["cheap"] == before
    _chat(routed, "cheap", max_tokens=None)
    assert rig.fakes["cheap"].bodies[-1]["max_tokens"] == CAP  # the default cap, sent upstream


# ---- 5. operations pages for operators only ---------------------------------------------------------------------


def test_operations_pages_need_the_admin_key(rig: Rig) -> None:
    for url in (rig.routed, rig.embedded):
        _chat(rig.client(ALL, url), "local" if url == rig.routed else "gpt-4o-mini")
        for path in ("/metrics", "/v1/stats"):
            for key in (None, ALL, NARROW, "sk-wrong"):
                headers = {"authorization": f"Bearer {key}"} if key else {}
                r = httpx.get(f"{url}{path}", headers=headers)
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, key)
            assert httpx.get(f"{url}{path}", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200 and httpx.get(f"{url}/ready").status_code == 200
        page = httpx.get(f"{url}/dashboard")  # the page holds no data: it asks for the admin key
        assert page.status_code == 200 and "admin key" in page.text


# ---- 6. secrets in the open -----------------------------------------------------------------------------------------


def test_keys_may_be_configured_as_sha256_hashes(rig: Rig) -> None:
    assert _chat(rig.client(HASHED, rig.embedded), "gpt-4o-mini").parse().choices
    with pytest.raises(openai.AuthenticationError):  # the hash itself is no key
        _chat(rig.client(_sha(HASHED), rig.embedded), "gpt-4o-mini")
    assert httpx.get(f"{rig.embedded}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).status_code == 200


def test_no_secret_in_logs_errors_metrics_or_pages(rig: Rig) -> None:
    bodies: list[str] = []
    with pytest.raises(openai.BadRequestError) as echoed:  # the upstream quotes the gateway's key for it
        _chat(rig.client(NARROW), "echo")
    bodies.append(echoed.value.response.text)
    assert "[redacted]" in echoed.value.message
    for key in (ALL[:-1], ALL + "x", f"{ALL} {ADMIN}"):  # near misses
        r = httpx.post(f"{rig.routed}/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, json={})
        assert r.status_code == 401
        bodies.append(r.text)
    for exc_call in (lambda: _chat(rig.client(NARROW), "premium"), lambda: _chat(rig.client(ALL), "cheap", max_tokens=99)):
        with pytest.raises(openai.APIStatusError) as err:
            exc_call()
        bodies.append(err.value.response.text)
    admin, user = {"authorization": f"Bearer {ADMIN}"}, {"authorization": f"Bearer {ALL}"}
    for url in (rig.routed, rig.embedded):
        for path in ("/metrics", "/v1/stats", "/dashboard", "/dashboard/dashboard.js", "/v1/models"):
            bodies.append(httpx.get(f"{url}{path}", headers=user if path == "/v1/models" else admin).text)
    time.sleep(0.2)  # the access log line is written just after the response
    bodies.append(rig.log_path.read_text())
    for secret in SECRETS:
        for text in bodies:
            assert secret not in text
