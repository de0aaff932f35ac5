"""Tenants sealed behind the router, and replicas sharing one cache, in the compose topology as real processes.

Two `python -m gateway --embedded-only` replicas (the real model and embedder, exact and semantic cache in a real redis-server,
`cache.tenant_secret` set) and three torch-free `python -m gateway` routers: two with the secret (compose's gateway,
twice), one without (a router that cannot vouch for tenants). Every request goes over HTTP between real processes.

Checks: tenant B never receives tenant A's entry — exact or semantic, through a model name, a single-replica model,
`auto`, a fallback, a stream, chat or completions — while A's own repeats hit (so each miss is a real one); an entry
written through one gateway and one backend replica is served through the other gateway and the other replica; a
client that sends the tenant header straight to a backend without the router's signature stays in its own namespace;
a router without the secret makes the backends neither serve nor store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from cache_fixtures import REDIS_SKIP, free_port, start_redis

from bench.server import stop_processes, wait_ready
from gateway.cache.keys import namespace
from gateway.cache.tenancy import SIGNATURE_HEADER, TENANT_HEADER, sign

ROOT = Path(__file__).resolve().parents[1]
KEY_A, KEY_B = "sk-tenant-a", "sk-tenant-b"
SECRET = "test-tenant-secret"
MAX_TOKENS = 6


@dataclass
class Topology:
    gateways: dict[str, str]  # name -> URL: gw1, gw2 (with the secret), open (without)
    backends: dict[str, str]  # b1, b2
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


@dataclass
class Answer:
    cache: str  # the backend's verdict: hit | semantic-hit | miss ("" when it did not say)
    cached: bool  # usage.cached: the answer is a replay
    deployment: str
    text: str


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


def _router_config(backends: dict[str, str], redis_url: str) -> dict[str, Any]:
    def dep(name: str, url: str) -> dict[str, Any]:
        return {"kind": "backend", "name": name, "base_url": f"{url}/v1", "model": "SmolLM2-135M-Instruct",
                "first_token_timeout_s": 120.0, "timeout_s": 180.0}  # fmt: skip

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every attempt fails to connect
    return {
        "embeddings": False,
        "cache": {"backend": "redis", "redis_url": redis_url},  # as docker/gateway.yaml
        "api_keys": [KEY_A, KEY_B],
        "models": {
            "smollm": {"deployments": [dep("b1", backends["b1"]), dep("b2", backends["b2"])]},
            "smollm-b1": {"deployments": [dep("b1", backends["b1"])]},
            "smollm-b2": {"deployments": [dep("b2", backends["b2"])]},
            "broken": {"deployments": [dep("dead", dead)]},
        },
        "fallbacks": {"broken": ["smollm"]},
        "auto": {"small": "smollm-b1", "large": "smollm-b2", "use_embeddings": False},
        "router": {"redis_url": redis_url, "redis_prefix": f"tenancy{free_port()}", "num_retries": 0,
                   "backoff_base_s": 0.01},
    }  # fmt: skip


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    redis = start_redis()
    if redis is None:
        pytest.skip(REDIS_SKIP)
    logs = tmp_path_factory.mktemp("tenancy")
    backend_env = {
        "SMOLGATE_EMBEDDINGS": "true", "SMOLGATE_KV_CACHE_MEMORY_MB": "64", "SMOLGATE_MAX_MODEL_LEN": "512",
        "SMOLGATE_NUM_THREADS": "1", "SMOLGATE_API_KEYS": "", "SMOLGATE_ACCESS_LOG": "false",
        "SMOLGATE_CACHE_BACKEND": "redis", "SMOLGATE_CACHE_REDIS_URL": redis.url,
        "SMOLGATE_CACHE_KEY_PREFIX": f"tenancy{free_port()}", "SMOLGATE_CACHE_SEMANTIC": "true",
        "SMOLGATE_CACHE_TENANT_SECRET": SECRET,
    }  # fmt: skip
    ports = {name: free_port() for name in ("b1", "b2")}
    backends = {
        n: _spawn(["-m", "gateway", "--embedded-only", "--host", "127.0.0.1", "--port", str(p)], backend_env, logs / f"{n}.log")
        for n, p in ports.items()
    }
    backend_urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    config = logs / "gateway.yaml"
    config.write_text(yaml.safe_dump(_router_config(backend_urls, redis.url)))
    gw_env = {"SMOLGATE_CONFIG": str(config), "SMOLGATE_ACCESS_LOG": "false"}
    secrets = {"gw1": SECRET, "gw2": SECRET, "open": ""}
    gw_ports = {name: free_port() for name in secrets}
    gateways = {
        n: _spawn(["-m", "gateway", "--port", str(p)], {**gw_env, "SMOLGATE_CACHE_TENANT_SECRET": secrets[n]}, logs / f"{n}.log")
        for n, p in gw_ports.items()
    }
    gateway_urls = {n: f"http://127.0.0.1:{p}" for n, p in gw_ports.items()}
    topo = Topology(gateway_urls, backend_urls, [*backends.values(), *gateways.values()])
    try:
        for name, proc in backends.items():
            wait_ready(backend_urls[name], proc, 300, logs / f"{name}.log")
        for name, proc in gateways.items():
            wait_ready(topo.gateways[name], proc, 120, logs / f"{name}.log")
        yield topo
    finally:
        stop_processes(topo.procs)
        redis.stop()


def _unique(text: str) -> str:
    return f"{text} (case {uuid.uuid4().int % 10**8})"


def _chat(question: str, model: str = "smollm", system: str | None = None, **kw: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **kw}


def _post(url: str, body: dict[str, Any], headers: dict[str, str], path: str = "/v1/chat/completions") -> Answer:
    """One request; a stream is read to its end, its verdict taken from the final usage chunk."""
    if body.get("stream"):
        body = {**body, "stream_options": {"include_usage": True}}
        text, usage, deployment = [], {}, ""
        with httpx.stream("POST", url + path, json=body, headers=headers, timeout=300) as response:
            assert response.status_code == 200, response.read()
            deployment = response.headers.get("x-smolgate-deployment", "")
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                assert "error" not in chunk, chunk
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices", []):
                    text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
        return Answer("", bool(usage.get("cached")), deployment, "".join(text))
    response = httpx.post(url + path, json=body, headers=headers, timeout=300)
    assert response.status_code == 200, response.text
    data = response.json()
    choice = data["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    cached = bool(data["usage"].get("cached"))
    return Answer(response.headers.get("x-cache", ""), cached, response.headers.get("x-smolgate-deployment", ""), text)


def ask(t: Topology, gateway: str, key: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> Answer:
    return _post(t.gateways[gateway], body, {"authorization": f"Bearer {key}"}, path)


def test_exact_entries_are_sealed_per_tenant_and_shared_by_the_gateways(topo: Topology) -> None:
    body = _chat(_unique("Name a color."))
    first = ask(topo, "gw1", KEY_A, body)
    assert (first.cache, first.cached) == ("miss", False)
    again = ask(topo, "gw2", KEY_A, body)  # the other gateway replica, the same tenant
    assert (again.cache, again.cached, again.text) == ("hit", True, first.text)
    other = ask(topo, "gw1", KEY_B, body)
    assert (other.cache, other.cached) == ("miss", False)
    assert ask(topo, "gw2", KEY_B, body).cache == "hit"  # B's own answer is B's own entry: a namespace that works


def test_completions_are_sealed_too(topo: Topology) -> None:
    body = {"model": "smollm", "prompt": _unique("The sky is"), "max_tokens": MAX_TOKENS, "temperature": 0}
    path = "/v1/completions"
    assert ask(topo, "gw1", KEY_A, body, path).cache == "miss"
    assert ask(topo, "gw2", KEY_A, body, path).cache == "hit"
    other = ask(topo, "gw1", KEY_B, body, path)
    assert (other.cache, other.cached) == ("miss", False)


def test_an_entry_written_through_one_replica_is_served_by_the_other(topo: Topology) -> None:
    """Gateway 1 -> backend 1 writes; gateway 2 -> backend 2 reads, through the shared redis-server."""
    body = _chat(_unique("Name a river."), model="smollm-b1")
    first = ask(topo, "gw1", KEY_A, body)
    assert (first.cache, first.deployment) == ("miss", "b1")
    served = ask(topo, "gw2", KEY_A, {**body, "model": "smollm-b2"})
    assert (served.cache, served.deployment, served.text) == ("hit", "b2", first.text)
    other = ask(topo, "gw2", KEY_B, {**body, "model": "smollm-b2"})
    assert (other.cache, other.deployment) == ("miss", "b2")


def test_auto_and_fallbacks_are_sealed(topo: Topology) -> None:
    auto = _chat(_unique("Name a fruit."), model="auto")
    assert ask(topo, "gw1", KEY_A, auto).cache == "miss"
    assert ask(topo, "gw2", KEY_A, auto).cache == "hit"
    assert ask(topo, "gw2", KEY_B, auto).cache == "miss"
    fallback = _chat(_unique("Name a tree."), model="broken")  # every deployment of `broken` is down: smollm answers
    first = ask(topo, "gw1", KEY_A, fallback)
    assert first.cache == "miss" and first.deployment in ("b1", "b2")
    assert ask(topo, "gw2", KEY_A, fallback).cache == "hit"
    assert ask(topo, "gw2", KEY_A, {**fallback, "model": "smollm"}).cache == "hit"  # the same entry, asked directly
    assert ask(topo, "gw1", KEY_B, fallback).cache == "miss"


def test_streams_are_sealed(topo: Topology) -> None:
    body = _chat(_unique("Name a bird."), stream=True)
    first = ask(topo, "gw1", KEY_A, body)
    assert not first.cached and first.text
    replay = ask(topo, "gw2", KEY_A, body)
    assert replay.cached and replay.text == first.text
    assert not ask(topo, "gw1", KEY_B, body).cached
    assert ask(topo, "gw2", KEY_A, {**body, "stream": False}).cache == "hit"  # a stream's entry serves JSON too


def test_semantic_matches_stay_inside_a_tenant(topo: Topology) -> None:
    system = _unique("You are a geography tutor.")
    original = ask(topo, "gw1", KEY_A, _chat("What is the capital of France?", system=system))
    assert original.cache == "miss"
    paraphrase = _chat("What's the capital of France?", system=system)
    other = ask(topo, "gw2", KEY_B, paraphrase)  # B first: A's entry is the only candidate there is
    assert (other.cache, other.cached) == ("miss", False)
    mine = ask(topo, "gw2", KEY_A, paraphrase)  # the same paraphrase from A matches A's entry
    assert (mine.cache, mine.text) == ("semantic-hit", original.text)


def test_the_tenant_header_without_the_routers_signature_is_ignored(topo: Topology) -> None:
    body = _chat(_unique("Name a planet."), model="smollm-b1")
    assert ask(topo, "gw1", KEY_A, body).cache == "miss"  # stored under A's namespace, signed by the router
    tenant = namespace(f"Bearer {KEY_A}")
    url = topo.backends["b1"]
    attempts = [
        {TENANT_HEADER: tenant},  # the namespace header alone
        {TENANT_HEADER: tenant, SIGNATURE_HEADER: sign("a-guessed-secret", tenant)},  # a forged signature
        {TENANT_HEADER: tenant, SIGNATURE_HEADER: "0" * 64},
        {"authorization": f"Bearer {KEY_A}"},  # even A's own key, sent straight to the backend
        {"authorization": f"Bearer {KEY_A}", TENANT_HEADER: tenant},
    ]
    for headers in attempts:  # no-store: each attempt must find nothing, not even what the one before left
        answer = _post(url, {**body, "model": "SmolLM2-135M-Instruct"}, {**headers, "x-smolgate-cache": "no-store"})
        assert (answer.cache, answer.cached) == ("miss", False), headers
    signed = {TENANT_HEADER: tenant, SIGNATURE_HEADER: sign(SECRET, tenant)}  # what only the router can send
    assert _post(url, {**body, "model": "SmolLM2-135M-Instruct"}, signed).cache == "hit"


def test_a_router_without_the_secret_makes_the_backends_neither_serve_nor_store(topo: Topology) -> None:
    body = _chat(_unique("Name a mountain."))
    for _ in range(2):
        answer = ask(topo, "open", KEY_A, body)
        assert (answer.cache, answer.cached) == ("miss", False)
    assert ask(topo, "gw1", KEY_A, body).cache == "miss"  # the open router stored nothing, for anyone
    assert ask(topo, "open", KEY_A, body).cache == "miss"  # ...and does not serve A's entry either
    stream = ask(topo, "open", KEY_A, {**body, "stream": True})
    assert not stream.cached
