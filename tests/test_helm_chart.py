"""The Helm chart (deploy/helm/smolgate), rendered offline by Helm's own engine for every shipped value set
(deploy/chart.py, what `make chart` runs), and checked against what the code reads:

- every document validates against the Kubernetes schemas (1.27 and 1.37, strict) and the vendored CRDs;
- values.schema.json refuses unknown keys and wrong types;
- the engine's command, ports, probes and environment are ones `python -m gateway --embedded-only` accepts, and the
  gateway's ConfigMap and environment load through the gateway's own loader into the topology the chart means;
- every Secret and key a pod or ServiceMonitor references is rendered;
- the NetworkPolicies admit exactly gateway -> engine, gateway -> Redis (and engine -> Redis when the engines cache
  there), and the gateway from anywhere (or its `ingressFrom`);
- a real engine, started with the chart's command line and environment, answers the probes' paths and exports
  every metric the engine autoscalers (KEDA's queries, the HPA's external metrics) name.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cache_fixtures import free_port, start_redis
from test_docs import known_env_vars

from backend.config import load_engine_config, parse_args
from bench.server import stop_processes, wait_ready
from deploy.chart import Rendered, render, render_all, validate, value_sets
from gateway.config import load_config

pytest.importorskip("helm_python", reason="helm-python-sdk is not installed (make install brings it: pyproject's test extra)")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pyproject's test extra)")

ROOT = Path(__file__).resolve().parents[1]
COMPONENT = "app.kubernetes.io/component"


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    out = tmp_path_factory.mktemp("chart")
    rendered = {r.name: r for r in render_all(out)}
    for name in rendered:
        assert (out / f"{name}.yaml").stat().st_size > 0
    return rendered


def _container(r: Rendered, kind: str, suffix: str) -> dict[str, Any]:
    return r.one(kind, suffix)["spec"]["template"]["spec"]["containers"][0]


def _secrets(r: Rendered) -> dict[str, dict[str, str]]:
    return {s["metadata"]["name"]: s.get("stringData", {}) for s in r.of_kind("Secret")}


def _env(r: Rendered, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the pod would see it, secretKeyRefs read from the rendered Secrets."""
    secrets, env = _secrets(r), {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] in secrets, f"{r.name}: {var['name']} names Secret {ref['name']}, which is not rendered"
        assert ref["key"] in secrets[ref["name"]], f"{r.name}: Secret {ref['name']} has no key {ref['key']}"
        env[var["name"]] = secrets[ref["name"]][ref["key"]]
    return env


def test_every_shipped_value_set_renders_and_validates(sets: dict[str, Rendered]) -> None:
    assert set(sets) == {"cpu", "gpu", "keda", "prometheus-adapter", "external-redis"} == set(value_sets())
    for r in sets.values():
        assert not r.errors, f"{r.name}: {r.errors}"
        kinds = {d["kind"] for d in r.documents}
        assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
                "HorizontalPodAutoscaler", "NetworkPolicy"} <= kinds, r.name  # fmt: skip
    assert sets["keda"].one("ScaledObject")["spec"]["scaleTargetRef"]["kind"] == "StatefulSet"
    assert {p["metadata"]["name"] for p in sets["cpu"].of_kind("PodDisruptionBudget")} == {"smolgate-gateway", "smolgate-engine"}
    assert [m["type"] for m in sets["prometheus-adapter"].one("HorizontalPodAutoscaler", "engine")["spec"]["metrics"]] == [
        "External", "External"]  # fmt: skip
    assert not sets["cpu"].of_kind("ScaledObject") and len(sets["cpu"].of_kind("HorizontalPodAutoscaler")) == 1
    gpu = _container(sets["gpu"], "StatefulSet", "engine")["resources"]
    assert gpu["limits"]["nvidia.com/gpu"] == 1 and _env(sets["gpu"], _container(sets["gpu"], "StatefulSet", "engine"))[
        "SMOLGATE_DEVICE"] == "cuda"  # fmt: skip
    assert "nvidia.com/gpu" not in _container(sets["cpu"], "StatefulSet", "engine")["resources"]["limits"]
    external = sets["external-redis"]
    assert not [s for s in external.of_kind("StatefulSet") if s["metadata"]["name"].endswith("redis")]
    assert _env(external, _container(external, "StatefulSet", "engine"))["SMOLGATE_CACHE_REDIS_URL"].startswith("rediss://")
    assert "rediss://" not in yaml.safe_dump(external.one("ConfigMap"))  # the password stays in the Secret


def test_the_validators_catch_a_broken_document(sets: dict[str, Rendered]) -> None:
    """The independent checks can fail: an unknown field and a wrong type, in a built-in kind and in each CRD."""
    r = sets["keda"]
    engine = copy.deepcopy(r.one("StatefulSet", "engine"))
    engine["spec"]["replicass"] = 2
    assert any("replicass" in e for e in validate(engine))
    probe = copy.deepcopy(engine)
    del probe["spec"]["replicass"]
    probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = [8000]
    assert list(validate(probe))
    scaled = copy.deepcopy(r.one("ScaledObject"))
    scaled["spec"]["minReplicas"] = 1  # the HPA's name; KEDA's is minReplicaCount
    assert any("minReplicas" in e for e in validate(scaled))
    monitor = copy.deepcopy(r.one("ServiceMonitor", "engine"))
    monitor["spec"]["endpoints"][0]["interval"] = 15
    assert list(validate(monitor))


@pytest.mark.parametrize(
    "values, message",
    [
        ({"secrets": {"tenantSecret": "x" * 32}, "replicaCount": 3}, "replicaCount"),
        ({"secrets": {"tenantSecret": "x" * 32}, "engine": {"gpu": "yes"}}, "/engine/gpu"),
        ({"secrets": {"tenantSecret": "x" * 32}, "engine": {"autoscaling": {"mode": "hpa"}}}, "/engine/autoscaling/mode"),
        ({"secrets": {"tenantSecret": "x" * 32}, "engine": {"drain": {"seconds": 5}}}, "seconds"),
        ({"secrets": {"tenantSecret": "x" * 32}, "gateway": {"replicas": "2"}}, "/gateway/replicas"),
        ({"secrets": {"tenantSecret": "x" * 32}, "redis": {"externalUrl": "http://redis"}}, "/redis/externalUrl"),
        ({}, "secrets.tenantSecret is required"),
    ],
)
def test_bad_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception) as info:  # helm_python raises HelmValuesError or HelmError
        render(values)
    assert message in str(info.value)


def test_the_engine_runs_as_the_backend_reads_it(sets: dict[str, Rendered]) -> None:
    known = known_env_vars()
    for r in sets.values():
        engine = _container(r, "StatefulSet", "engine")
        args = parse_args(engine["command"][3:])  # python -m gateway ...
        assert engine["command"][:3] == ["python", "-m", "gateway"] and args.embedded_only
        assert args.port == engine["ports"][0]["containerPort"] == r.one("Service", "engine")["spec"]["ports"][0]["port"]
        assert engine["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"} == engine["startupProbe"]["httpGet"]
        assert engine["livenessProbe"]["httpGet"]["path"] == "/health"
        env = _env(r, engine)
        assert set(env) <= known, f"{r.name}: variables the engine does not read: {set(env) - known}"
        cfg = load_config(None, env)
        values = yaml.safe_load(value_sets()[r.name].read_text())
        for key, value in values.get("engine", {}).get("settings", {}).items():
            assert getattr(cfg.engine, key) == value, (r.name, key)
        assert cfg.cache.backend == "redis" and cfg.cache.tenant_secret and not cfg.embeddings
        drain = r.one("StatefulSet", "engine")["spec"]["template"]["spec"]
        pre_stop = int(engine["lifecycle"]["preStop"]["exec"]["command"][1])
        assert drain["terminationGracePeriodSeconds"] > pre_stop + cfg.drain_timeout_s  # SIGKILL only after the drain
        init = drain["initContainers"][0]
        assert "python -m backend.fetch" in init["command"][-1] and init["volumeMounts"][0]["mountPath"] == env["SMOLGATE_CACHE"]
        fetch = load_engine_config(None, _env(r, init))  # backend.fetch fetches the copy the engine will serve
        assert fetch.resolved_model() == cfg.engine.resolved_model() and fetch.quantization == cfg.engine.quantization


def test_the_gateway_loads_the_chart_config_and_routes_to_the_headless_service(
    sets: dict[str, Rendered], tmp_path: Path
) -> None:
    known = known_env_vars()
    for r in sets.values():
        gateway = _container(r, "Deployment", "gateway")
        env = _env(r, gateway)
        mount = next(m for m in gateway["volumeMounts"] if m["name"] == "config")
        assert env["SMOLGATE_CONFIG"] == f"{mount['mountPath']}/gateway.yaml"
        config = tmp_path / f"{r.name}.yaml"
        config.write_text(r.one("ConfigMap")["data"]["gateway.yaml"])
        assert {k for k in env if k.startswith("SMOLGATE_")} <= known
        cfg = load_config(config, env)  # api_key_env names must be set: the Secret supplies them
        values = yaml.safe_load(value_sets()[r.name].read_text())
        assert list(cfg.api_keys) == values["secrets"]["apiKeys"] and list(cfg.admin_keys) == values["secrets"]["adminKeys"]
        pod = r.one("Deployment", "gateway")["spec"]["template"]["spec"]
        pre_stop = int(gateway["lifecycle"]["preStop"]["exec"]["command"][1])
        assert pod["terminationGracePeriodSeconds"] > pre_stop + cfg.drain_timeout_s
        route = cfg.routing.model("SmolLM2-135M-Instruct")
        assert route is not None
        engine = next(d for d in route.deployments if d.kind == "backend")
        service = r.one("Service", "engine")
        assert engine.discovery == "dns" and engine.prefix_affinity and service["spec"]["clusterIP"] == "None"
        port = service["spec"]["ports"][0]["port"]
        assert engine.base_url == f"http://{service['metadata']['name']}.smolgate.svc.cluster.local:{port}/v1"
        engine_set = r.one("StatefulSet", "engine")
        assert engine_set["spec"]["serviceName"] == service["metadata"]["name"]  # stable pod names under it
        assert cfg.routing.router.redis_url == cfg.cache.redis_url and cfg.routing.router.redis_url.startswith("redis")
        ledger = values.get("ledger", {})  # the spend ledger: PostgreSQL from the Secret, else each pod's SQLite
        assert cfg.spend.ledger.url == (ledger["postgresUrl"] if ledger.get("postgres") else "")
        assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
        assert args_port(gateway) == gateway["ports"][0]["containerPort"]


def args_port(container: dict[str, Any]) -> int:
    return int(parse_args(container["command"][3:]).port)


def _references(node: Any) -> Iterator[tuple[str, str]]:
    """(Secret name, key) of every secretKeyRef and ServiceMonitor credential in a document."""
    if isinstance(node, dict):
        if "secretKeyRef" in node:
            yield node["secretKeyRef"]["name"], node["secretKeyRef"]["key"]
        if "credentials" in node:
            yield node["credentials"]["name"], node["credentials"]["key"]
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def test_every_referenced_secret_exists(sets: dict[str, Rendered]) -> None:
    for r in sets.values():
        secrets = _secrets(r)
        refs = {ref for d in r.documents for ref in _references(d)}
        assert refs, r.name
        missing = {(n, k) for n, k in refs if k not in secrets.get(n, {})}
        assert not missing, f"{r.name}: {missing}"
    keda = sets["keda"]
    assert ("smolgate-secrets", "metrics-key") in {ref for d in keda.of_kind("ServiceMonitor") for ref in _references(d)}


def _pods(r: Rendered) -> dict[str, dict[str, Any]]:
    """component -> the pod template (its labels and ports) of each workload."""
    return {w["spec"]["template"]["metadata"]["labels"][COMPONENT]: w["spec"]["template"]
            for w in r.documents if w["kind"] in ("Deployment", "StatefulSet")}  # fmt: skip


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _admitted(r: Rendered) -> dict[str, set[str]]:
    """For each component: which components may open connections to it ('*' = anyone; a namespaceSelector peer is
    named 'ns:<labels>'). A component no policy selects is open to all (Kubernetes' default)."""
    pods = _pods(r)
    out: dict[str, set[str]] = {}
    for component, pod in pods.items():
        labels = pod["metadata"]["labels"]
        policies = [p for p in r.of_kind("NetworkPolicy") if _selects(p["spec"]["podSelector"], labels)]
        if not policies:
            out[component] = {"*"}
            continue
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
        allowed: set[str] = set()
        for policy in policies:
            assert policy["spec"]["policyTypes"] == ["Ingress"]
            for rule in policy["spec"].get("ingress", []):
                assert {p["port"] for p in rule.get("ports", [])} <= ports, f"{r.name}: a policy names a port {component} lacks"
                if "from" not in rule:
                    allowed.add("*")
                for peer in rule.get("from", []):
                    if "podSelector" in peer and "namespaceSelector" not in peer:
                        allowed |= {c for c, p in pods.items() if _selects(peer["podSelector"], p["metadata"]["labels"])}
                    else:
                        allowed.add("ns:" + ",".join(sorted(peer["namespaceSelector"]["matchLabels"].values())))
        out[component] = allowed
    return out


def test_network_policies_admit_exactly_the_gateways_traffic(sets: dict[str, Rendered]) -> None:
    for r in sets.values():
        admitted = _admitted(r)
        values = yaml.safe_load(value_sets()[r.name].read_text())
        scrapers = {"ns:monitoring"} if values.get("networkPolicy", {}).get("metricsFrom") else set()
        assert admitted["engine"] == {"gateway"} | scrapers, r.name
        if "redis" in admitted:  # the chart's Redis; the engines cache their answers in it (engine.responseCache)
            assert admitted["redis"] == {"gateway", "engine"}, r.name
        ingress = values.get("networkPolicy", {}).get("ingressFrom")
        assert admitted["gateway"] == ({"ns:ingress-nginx"} | scrapers if ingress else {"*"}), r.name
        services = {s["metadata"]["name"]: s["spec"].get("type", "ClusterIP") for s in r.of_kind("Service")}
        assert all(t == "ClusterIP" for t in services.values())  # nothing published outside the cluster by default
    memory = render({"secrets": {"tenantSecret": "x" * 32}, "engine": {"responseCache": "memory"}})
    assert _admitted(memory)["redis"] == {"gateway"}


# ---- a live engine, started as the chart starts it ----------------------------------------------------------


@pytest.fixture(scope="module")
def live_engine(sets: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m gateway --embedded-only` with the cpu value set's command line and environment; only what cannot
    hold on this machine differs: the bind address and port, the model folder, Redis' address, and a small KV pool."""
    r = sets["cpu"]
    engine = _container(r, "StatefulSet", "engine")
    env = _env(r, engine)
    port = free_port()
    redis = start_redis()
    local = {"SMOLGATE_KV_CACHE_MEMORY_MB": "64", "SMOLGATE_MAX_MODEL_LEN": "512", "SMOLGATE_NUM_THREADS": "1"}
    if redis is not None:
        local["SMOLGATE_CACHE_REDIS_URL"] = redis.url
    else:
        local["SMOLGATE_CACHE_BACKEND"] = "memory"
    env = {k: v for k, v in env.items() if k != "SMOLGATE_CACHE"} | local  # the models: this machine's cache folder
    command = [a.replace("0.0.0.0", "127.0.0.1").replace(str(args_port(engine)), str(port)) for a in engine["command"]]
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    base = {k: v for k, v in os.environ.items() if not k.startswith("SMOLGATE_") or k == "SMOLGATE_CACHE"}
    proc = subprocess.Popen([sys.executable, *command[1:]], cwd=ROOT, env={**base, **env},
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, 240, log)
        yield url
    finally:
        stop_processes([proc])
        if redis is not None:
            redis.stop()


def _autoscaler_metrics(r: Rendered) -> set[str]:
    names: set[str] = set()
    for scaled in r.of_kind("ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            names |= set(re.findall(r"\b(smolgate_[a-z0-9_]+)\{", trigger["metadata"]["query"]))
    for hpa in r.of_kind("HorizontalPodAutoscaler"):
        names |= {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"}
    return names


def test_a_live_engine_answers_the_probes_and_exports_the_autoscalers_metrics(
    sets: dict[str, Rendered], live_engine: str
) -> None:
    engine = _container(sets["cpu"], "StatefulSet", "engine")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert httpx.get(live_engine + engine[probe]["httpGet"]["path"]).status_code == 200
    httpx.post(f"{live_engine}/v1/completions", json={"model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2},
               timeout=60).raise_for_status()  # fmt: skip
    scrape = httpx.get(f"{live_engine}/metrics").text  # the engine has no API keys: Prometheus scrapes it as is
    exported = {line.split("{")[0].split()[0] for line in scrape.splitlines() if line and not line.startswith("#")}
    for name in ("keda", "prometheus-adapter"):
        wanted = _autoscaler_metrics(sets[name])
        assert wanted == {"smolgate_engine_waiting_requests", "smolgate_kv_cache_usage_ratio"}, name
        assert wanted <= exported, f"{name}: not on a live engine's /metrics: {wanted - exported}"
