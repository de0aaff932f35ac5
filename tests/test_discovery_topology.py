"""The Helm chart's topology as local processes, with the cluster's DNS played by a server the test controls
(tests/dns_fixtures.py): three `python -m gateway --embedded-only` replicas of the real model, each on its own
loopback address and the same port (as pods behind a headless Service), a real redis-server, and two torch-free
gateways that find the replicas by resolving one name (`discovery: dns`, deploy/helm/smolgate's ConfigMap).

Checks: a conversation (or a prompt_cache_key) stays on one replica through either gateway, replicas named by their
PTR records (a StatefulSet's pod names); a replica added to the records while load runs takes new conversations
within seconds, no restart; a replica removed from the records and sent SIGTERM at once, mid-stream, finishes its
streams while it drains, the requests that raced its shutdown are retried on the others, and no request is lost.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from cache_fixtures import REDIS_SKIP, free_port, start_redis
from dns_fixtures import DnsServer

from bench.server import stop_processes, wait_ready

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-discovery-topology"
SERVICE = "smolgate-engine.smolgate.svc.cluster.local"
ADDRESSES = {"smolgate-engine-0": "127.0.0.2", "smolgate-engine-1": "127.0.0.3", "smolgate-engine-2": "127.0.0.4"}
DRAIN_S = 30


@dataclass
class Cluster:
    dns: DnsServer
    engines: dict[str, subprocess.Popen[bytes]]
    gateways: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def client(self, i: int = 0) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateways[i]}/v1", api_key=KEY, max_retries=0, timeout=120)

    def publish(self, *pods: str) -> None:
        """The headless Service's A records: the pods that are ready (and not terminating)."""
        self.dns.set(SERVICE, [ADDRESSES[p] for p in pods])


def _port_free_on_every_address() -> int:
    for _ in range(20):
        port = free_port()
        try:
            for address in ADDRESSES.values():
                with socket.socket() as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on every loopback address")


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SMOLGATE_") or k == "SMOLGATE_CACHE"}
    out = log.open("wb")
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env={**base, **env}, stdout=out, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    redis = start_redis()
    if redis is None:
        pytest.skip(REDIS_SKIP)
    logs = tmp_path_factory.mktemp("discovery")
    dns = DnsServer().start()
    dns.ptr = {address: f"{pod}.{SERVICE}" for pod, address in ADDRESSES.items()}
    port = _port_free_on_every_address()
    engine_env = {"SMOLGATE_EMBEDDINGS": "false", "SMOLGATE_KV_CACHE_MEMORY_MB": "64", "SMOLGATE_MAX_MODEL_LEN": "512",
                  "SMOLGATE_NUM_THREADS": "1", "SMOLGATE_ACCESS_LOG": "false", "SMOLGATE_CACHE_BACKEND": "off",
                  "SMOLGATE_DRAIN_TIMEOUT_S": str(DRAIN_S)}  # fmt: skip
    engines = {
        pod: _spawn(["-m", "gateway", "--embedded-only", "--host", address, "--port", str(port)], engine_env, logs / f"{pod}.log")
        for pod, address in ADDRESSES.items()
    }
    deployment = {"kind": "backend", "name": "engine", "base_url": f"http://{SERVICE}:{port}/v1", "discovery": "dns",
                  "model": "SmolLM2-135M-Instruct", "first_token_timeout_s": 60.0, "timeout_s": 120.0}  # fmt: skip
    config = {
        "embeddings": False, "cache": {"backend": "off"}, "api_keys": [KEY], "admin_keys": [KEY],
        "models": {"smollm": {"deployments": [deployment]}},
        "router": {"redis_url": redis.url, "redis_prefix": f"disc{port}", "discovery_interval_s": 0.5,
                   "discovery_nameservers": dns.address, "backoff_base_s": 0.05, "cooldown_failures": 1, "cooldown_s": 60.0},
    }  # fmt: skip
    (logs / "gateway.yaml").write_text(yaml.safe_dump(config))
    gateway_ports = [free_port(), free_port()]
    gw_env = {"SMOLGATE_CONFIG": str(logs / "gateway.yaml"), "SMOLGATE_ACCESS_LOG": "false"}
    gateways = [_spawn(["-m", "gateway", "--port", str(p)], gw_env, logs / f"gw{i}.log") for i, p in enumerate(gateway_ports)]
    c = Cluster(dns, engines, [f"http://127.0.0.1:{p}" for p in gateway_ports], [*engines.values(), *gateways])
    try:
        for pod, proc in engines.items():
            wait_ready(f"http://{ADDRESSES[pod]}:{port}", proc, 300, logs / f"{pod}.log")
        c.publish("smolgate-engine-0", "smolgate-engine-1")  # the third one joins under load, later
        for i, proc in enumerate(gateways):
            wait_ready(c.gateways[i], proc, 120, logs / f"gw{i}.log")
            _wait_for_replicas(c.gateways[i], 2)
        yield c
    finally:
        stop_processes(c.procs)
        dns.stop()
        redis.stop()


def _wait_for_replicas(gateway: str, count: int, timeout_s: float = 10) -> None:
    """Until the gateway's router lists `count` replicas (its next re-resolution after a change of records)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = httpx.get(f"{gateway}/metrics", headers={"authorization": f"Bearer {KEY}"}).text
        if sum(line.startswith("smolgate_router_deployment_available{") for line in text.splitlines()) == count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{gateway} did not find {count} replicas")


def _chat(c: Cluster, gateway: int, first: str, turns: int = 1, max_tokens: int = 4, **extra: Any) -> str:
    """One non-streamed chat turn; the replica that answered."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "Answer in a few words."}, {"role": "user", "content": first}]
    for i in range(1, turns):
        messages += [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": f"And then {i}?"}]
    raw = c.client(gateway).chat.completions.with_raw_response.create(
        model="smollm", messages=messages, max_tokens=max_tokens, temperature=0, **extra  # type: ignore[arg-type]
    )
    assert raw.parse().choices[0].message.content is not None
    return raw.headers["x-smolgate-deployment"]


def test_a_conversation_stays_on_its_replica_through_either_gateway(cluster: Cluster) -> None:
    placed = {i: _chat(cluster, i % 2, f"Name a fruit, conversation {i}.") for i in range(8)}
    assert set(placed.values()) == {"engine/smolgate-engine-0", "engine/smolgate-engine-1"}  # named by their PTR records
    for i in range(8):
        assert _chat(cluster, (i + 1) % 2, f"Name a fruit, conversation {i}.", turns=2) == placed[i]
        assert _chat(cluster, i % 2, f"Name a fruit, conversation {i}.", turns=3) == placed[i]
    keyed = {_chat(cluster, g, f"Unrelated question {g}.", extra_body={"prompt_cache_key": "session-42"}) for g in (0, 1, 0, 1)}
    assert len(keyed) == 1  # one prompt_cache_key, one replica, whatever the prompt


@dataclass
class Load:
    """Non-streamed requests, each a new conversation, from `workers` threads until stopped: (time, replica or error)."""

    cluster: Cluster
    workers: int = 4
    results: list[tuple[float, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> Load:
        for w in range(self.workers):
            self._threads.append(threading.Thread(target=self._run, args=(w,), daemon=True))
            self._threads[-1].start()
        return self

    def _run(self, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            try:
                served = _chat(self.cluster, (worker + n) % 2, f"Load {worker}-{n}-{time.monotonic_ns()}: name a colour.")
            except Exception as exc:  # an API error, or an answer without content: both count as lost
                served = f"error:{type(exc).__name__}:{exc}"
            self.results.append((time.monotonic(), served))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)

    def errors(self) -> list[str]:
        return [r for _, r in self.results if r.startswith("error:")]


def test_a_replica_added_under_load_takes_new_conversations_within_seconds(cluster: Cluster) -> None:
    with Load(cluster) as load:
        time.sleep(2.0)
        added = time.monotonic()
        cluster.publish("smolgate-engine-0", "smolgate-engine-1", "smolgate-engine-2")
        deadline = added + 30
        while time.monotonic() < deadline and not any(r == "engine/smolgate-engine-2" for _, r in load.results):
            time.sleep(0.1)
        time.sleep(3.0)  # more conversations, spread over three replicas now
    first = min((t for t, r in load.results if r == "engine/smolgate-engine-2"), default=None)
    assert first is not None, "the added replica took no request"
    assert first - added < 10, f"the added replica took its first request {first - added:.1f} s after it was published"
    before = {r for t, r in load.results if t < added}
    assert before <= {"engine/smolgate-engine-0", "engine/smolgate-engine-1"}
    assert not load.errors(), load.errors()  # nothing lost while the topology changed
    assert len(load.results) >= 8


def _stream(c: Cluster, gateway: int, prompt: str, tokens: int, started: threading.Event) -> str:
    """A streamed turn of `tokens` tokens (ignore_eos): 'ok' when it ended normally with all of them, else what broke."""
    try:
        stream = c.client(gateway).chat.completions.create(
            model="smollm", messages=[{"role": "user", "content": prompt}], max_tokens=tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )  # fmt: skip
        finish, usage = None, None
        for chunk in stream:
            started.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            usage = chunk.usage or usage
        return "ok" if finish == "length" and usage is not None and usage.completion_tokens == tokens else f"short:{finish}"
    except openai.APIError as exc:  # a clean error is allowed for a stream; a hang or a silent cut is not
        return f"error:{type(exc).__name__}"


def test_a_replica_removed_mid_stream_finishes_its_streams_and_loses_no_request(cluster: Cluster) -> None:
    victim = "engine/smolgate-engine-0"
    prompts = [p for p in (f"Tell a long story, number {i}." for i in range(40)) if _chat(cluster, 0, p, max_tokens=1) == victim]
    assert len(prompts) >= 2, "no conversation lands on the victim"
    prompts = prompts[:3]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool, Load(cluster, workers=3) as load:
        started = [threading.Event() for _ in prompts]
        streams = [pool.submit(_stream, cluster, i % 2, p, 64, started[i]) for i, p in enumerate(prompts)]
        for event in started:
            assert event.wait(60), "a stream never started"
        removed = time.monotonic()
        # the pod terminates: its record goes and SIGTERM arrives at once (no preStop wait, the harder case: requests
        # the gateways send it before they re-resolve meet a closed socket and must be retried on the others)
        cluster.publish("smolgate-engine-1", "smolgate-engine-2")
        cluster.engines["smolgate-engine-0"].send_signal(signal.SIGTERM)
        outcomes = [s.result(timeout=DRAIN_S + 30) for s in streams]
        time.sleep(2.0)
    assert outcomes == ["ok"] * len(prompts), outcomes  # the streams it was serving finished during its drain
    rc = cluster.engines["smolgate-engine-0"].wait(DRAIN_S + 10)  # then it exited cleanly
    assert rc in (0, -signal.SIGTERM), rc  # uvicorn re-raises the signal once its graceful shutdown is done
    assert not load.errors(), load.errors()  # every non-streamed request answered: retried elsewhere when it raced
    late = [r for t, r in load.results if t > removed + 1.5]
    assert late and victim not in late, late  # the gateways stopped sending it anything within the re-resolution
