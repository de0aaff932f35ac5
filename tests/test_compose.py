"""compose.yaml and the Dockerfiles: `docker compose config` validates (when a compose CLI is installed;
there is no Docker engine here), and the topology hangs together: the gateway's config routes to the backend
services compose defines, every long-running service has a healthcheck, the model lives in a named volume."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_validates() -> None:
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor docker-compose is installed (make test installs docker-compose with apt)")
    done = subprocess.run([*cli, "-f", str(ROOT / "compose.yaml"), "config", "-q"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_topology_hangs_together() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert {"gateway", "backend-1", "backend-2", "redis", "models"} <= set(services)
    assert "models" in compose["volumes"]
    for name, svc in services.items():
        if name != "models":
            assert "healthcheck" in svc, name
    cfg = load_config(ROOT / "docker" / "gateway.yaml", environ={})
    (model,) = cfg.routing.models
    hosts = {d.base_url.split("//")[1].split(":")[0] for d in model.deployments}
    assert hosts == {"backend-1", "backend-2"} and not cfg.routing.needs_engine  # the gateway image has no torch
    assert cfg.routing.router.redis_url.startswith("redis://redis:")
    for dockerfile in ("backend.Dockerfile", "gateway.Dockerfile"):
        assert (ROOT / "docker" / dockerfile).is_file()
    requirements = (ROOT / "docker" / "gateway-requirements.txt").read_text().splitlines()
    assert not [r for r in requirements if r.startswith(("torch", "transformers", "triton"))]


def test_the_cache_lives_in_the_compose_redis_and_tenants_are_signed() -> None:
    """Both backends cache in the compose Redis (so replicas share entries), under namespaces the gateway signs with
    the same secret it has; the gateway's own cache section points at that Redis too."""
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    gateway_secret = services["gateway"]["environment"]["SMOLGATE_CACHE_TENANT_SECRET"]
    assert gateway_secret
    for name in ("backend-1", "backend-2"):
        env = services[name]["environment"]
        assert env["SMOLGATE_CACHE_BACKEND"] == "redis" and env["SMOLGATE_CACHE_REDIS_URL"].startswith("redis://redis:")
        assert env["SMOLGATE_CACHE_TENANT_SECRET"] == gateway_secret
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy"
        cfg = load_config(None, environ={k: str(v) for k, v in env.items()})
        assert cfg.cache.backend == "redis" and cfg.cache.tenant_secret
    gateway = load_config(ROOT / "docker" / "gateway.yaml", environ={"SMOLGATE_CACHE_TENANT_SECRET": "s"})
    assert gateway.cache.backend == "redis" and gateway.cache.redis_url.startswith("redis://redis:")
    assert gateway.cache.tenant_secret == "s"
