"""The compose topology as local processes: two `python -m gateway --embedded-only` replicas (the real model), a real
redis-server, and two torch-free `python -m gateway` replicas routing to the backends over HTTP.

Checks: both backends serve; a conversation sticks to one backend whichever gateway it goes through (prefix
affinity is a pure function of the conversation); a key's rpm is shared by the gateways through Redis; a
backend killed during load costs no hang: in-flight requests are retried or end with a clear error, and new
requests go to the healthy replica.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from cache_fixtures import REDIS_SKIP, free_port, start_redis

from bench.server import stop_processes, wait_ready

ROOT = Path(__file__).resolve().parents[1]
KEY, LIMITED_KEY, LIMITED_RPM = "sk-topology", "sk-topology-limited", 4


@dataclass
class Topology:
    backends: dict[str, subprocess.Popen[bytes]]
    gateways: list[str]
    backend_urls: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def client(self, i: int = 0, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateways[i]}/v1", api_key=key, max_retries=0, timeout=120)


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("wb")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)


def _gateway_config(backends: dict[str, str], redis_url: str) -> dict[str, object]:
    def dep(name: str) -> dict[str, object]:
        return {"kind": "backend", "name": name, "base_url": f"{backends[name]}/v1", "model": "SmolLM2-135M-Instruct",
                "first_token_timeout_s": 60.0, "timeout_s": 120.0}  # fmt: skip

    return {
        "embeddings": False,
        "cache": {"backend": "off"},
        "api_keys": [KEY, {"key": LIMITED_KEY, "name": "limited", "rpm": LIMITED_RPM}],
        "admin_keys": [KEY],
        "models": {"smollm": {"deployments": [dep("b1"), dep("b2")]}},
        "model_aliases": {"gpt-4o-mini": "smollm"},
        "router": {"redis_url": redis_url, "redis_prefix": f"topo{free_port()}", "cooldown_failures": 1, "cooldown_s": 60.0,
                   "backoff_base_s": 0.05},
    }  # fmt: skip


@pytest.fixture(scope="module")
def topo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Topology]:
    redis = start_redis()
    if redis is None:
        pytest.skip(REDIS_SKIP)
    logs = tmp_path_factory.mktemp("topology")
    backend_env = {"SMOLGATE_EMBEDDINGS": "false", "SMOLGATE_KV_CACHE_MEMORY_MB": "64", "SMOLGATE_MAX_MODEL_LEN": "512",
                   "SMOLGATE_NUM_THREADS": "1", "SMOLGATE_API_KEYS": "", "SMOLGATE_ACCESS_LOG": "false"}  # fmt: skip
    ports = {name: free_port() for name in ("b1", "b2")}
    backends = {
        n: _spawn(["-m", "gateway", "--embedded-only", "--host", "127.0.0.1", "--port", str(p)], backend_env, logs / f"{n}.log")
        for n, p in ports.items()
    }
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    config = logs / "gateway.yaml"
    config.write_text(yaml.safe_dump(_gateway_config(urls, redis.url)))
    gateway_ports = [free_port(), free_port()]
    gw_env = {"SMOLGATE_CONFIG": str(config), "SMOLGATE_ACCESS_LOG": "false"}
    gateways = [_spawn(["-m", "gateway", "--port", str(p)], gw_env, logs / f"gw{i}.log") for i, p in enumerate(gateway_ports)]
    topo = Topology(backends, [f"http://127.0.0.1:{p}" for p in gateway_ports], urls, [*backends.values(), *gateways])
    try:
        for name, proc in backends.items():
            wait_ready(urls[name], proc, 240, logs / f"{name}.log")
        for i, proc in enumerate(gateways):
            wait_ready(topo.gateways[i], proc, 240, logs / f"gw{i}.log")
        yield topo
    finally:
        stop_processes(topo.procs)
        redis.stop()


def _chat(t: Topology, gateway: int, first: str, turns: int = 1, max_tokens: int = 4) -> tuple[str, str]:
    messages = [{"role": "system", "content": "Answer in a few words."}, {"role": "user", "content": first}]
    for i in range(1, turns):
        messages += [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": f"And then {i}?"}]
    raw = t.client(gateway).chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=messages, max_tokens=max_tokens, temperature=0  # type: ignore[arg-type]
    )
    return raw.headers["x-smolgate-deployment"], raw.parse().choices[0].message.content or ""


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
    return next(float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + " "))


def test_the_gateways_route_conversations_to_both_backends_and_keep_them_there(topo: Topology) -> None:
    hits_before = sum(_metric(u, "smolgate_prefix_cache_hits_total") for u in topo.backend_urls.values())
    placed = {}
    for i in range(8):
        deployment, text = _chat(topo, i % 2, f"Name a fruit, conversation {i}.")
        assert text
        placed[i] = deployment
    assert set(placed.values()) == {"b1", "b2"}
    for i in range(4):  # later turns of each conversation, through either gateway: the same backend
        assert _chat(topo, i % 2, f"Name a fruit, conversation {i}.", turns=2)[0] == placed[i]
        assert _chat(topo, (i + 1) % 2, f"Name a fruit, conversation {i}.", turns=3)[0] == placed[i]
    for url in topo.gateways:  # each gateway counts the hits it saw itself (its own history of keys)
        assert _metric(url, "smolgate_router_prefix_hit_ratio") > 0
    # ...and the replicas' own prefix caches served the later turns' shared blocks
    assert sum(_metric(u, "smolgate_prefix_cache_hits_total") for u in topo.backend_urls.values()) > hits_before


def test_a_keys_rpm_is_shared_by_both_gateways_through_redis(topo: Topology) -> None:
    if time.time() % 60 > 45:  # fixed one-minute windows: don't straddle one
        time.sleep(61 - time.time() % 60)
    for i in range(LIMITED_RPM):
        topo.client(i % 2, LIMITED_KEY).models.list()  # not counted: only generation is limited
        topo.client(i % 2, LIMITED_KEY).completions.create(model="smollm", prompt="Hi", max_tokens=1)
    for i in range(2):
        with pytest.raises(openai.RateLimitError) as info:
            topo.client(i, LIMITED_KEY).completions.create(model="smollm", prompt="Hi", max_tokens=1)
        assert 1 <= int(info.value.response.headers["retry-after"]) <= 60


def test_a_backend_killed_during_load_costs_no_hang(topo: Topology) -> None:
    def one(i: int) -> str:
        try:
            if i % 2:
                stream = topo.client(i % 2).chat.completions.create(
                    model="smollm", messages=[{"role": "user", "content": f"Count to ten, run {i}."}], max_tokens=24, stream=True
                )
                return "ok" if "".join(c.choices[0].delta.content or "" for c in stream if c.choices) else "empty"
            return "ok" if _chat(topo, 0, f"Count to ten, run {i}.", max_tokens=24)[1] else "empty"
        except openai.APIError as exc:  # a clear error is fine; a hang or a crash is not
            return f"error:{type(exc).__name__}"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(16)]
        time.sleep(1.0)
        topo.backends["b2"].send_signal(signal.SIGKILL)
        outcomes = [f.result(timeout=180) for f in futures]
    assert outcomes.count("ok") >= 12, outcomes  # non-streamed and not-yet-started requests were retried on b1
    assert all(o == "ok" or o.startswith("error:") for o in outcomes), outcomes
    for i in range(4):
        assert _chat(topo, i % 2, f"After the crash {i}.")[0] == "b1"
