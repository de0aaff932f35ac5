"""Tenant namespaces without a server: what the router forwards to a backend replica and what a backend trusts
(gateway/cache/tenancy.py), and where the shared secret may come from. The real-process version of all this is
tests/test_tenancy_topology.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from routing_fixtures import FakeUpstream, Servers

from gateway.app import build_context, create_app
from gateway.cache.config import CacheConfig
from gateway.cache.keys import namespace
from gateway.cache.tenancy import ROUTED_PREFIX, SIGNATURE_HEADER, TENANT_HEADER, forwarded_headers, request_namespace, sign
from gateway.config import ConfigError, from_mapping, load_config

SECRET = "s3cret"


def test_a_router_with_the_secret_signs_the_clients_namespace() -> None:
    sent = forwarded_headers(SECRET, {"authorization": "Bearer sk-a"})
    assert sent == {TENANT_HEADER: namespace("Bearer sk-a"), SIGNATURE_HEADER: sign(SECRET, namespace("Bearer sk-a"))}
    assert SECRET not in "".join(sent.values())  # the secret itself never travels
    assert forwarded_headers(SECRET, {})[TENANT_HEADER] == "public"  # no key: the anonymous tenant
    # the client's own narrowing directives still reach the backend
    assert forwarded_headers(SECRET, {"x-smolgate-cache": "no-store"})["x-smolgate-cache"] == "no-store"


def test_a_router_without_the_secret_tells_the_backend_not_to_cache() -> None:
    assert forwarded_headers("", {"authorization": "Bearer sk-a"}) == {"x-smolgate-cache": "no-lookup, no-store"}
    sent = forwarded_headers("", {"x-smolgate-cache": "ttl=5"})
    assert sent == {"x-smolgate-cache": "ttl=5, no-lookup, no-store"}


def test_a_backend_trusts_only_a_signed_namespace() -> None:
    tenant = namespace("Bearer sk-a")
    signed = {TENANT_HEADER: tenant, SIGNATURE_HEADER: sign(SECRET, tenant)}
    assert request_namespace(signed, SECRET) == ROUTED_PREFIX + tenant
    # a tenant header that does not verify: no namespace at all (the request is neither served nor stored)
    assert request_namespace(signed, "") is None  # a backend without the secret (misconfigured): no pooling
    assert request_namespace(signed, "another") is None
    assert request_namespace({TENANT_HEADER: tenant}, SECRET) is None
    forged = {TENANT_HEADER: tenant, SIGNATURE_HEADER: sign("guess", tenant), "authorization": "Bearer sk-a"}
    assert request_namespace(forged, SECRET) is None
    assert request_namespace({**signed, TENANT_HEADER: namespace("Bearer sk-b")}, SECRET) is None  # not transferable
    # without the header: the request's own key, never a routed namespace
    assert request_namespace({"authorization": "Bearer sk-a"}, SECRET) == namespace("Bearer sk-a")
    assert not namespace("Bearer sk-a").startswith(ROUTED_PREFIX) and request_namespace({}, "") == "public"


def test_the_secret_comes_from_the_environment_only(tmp_path: Path) -> None:
    cfg = load_config(None, environ={"SMOLGATE_CACHE_TENANT_SECRET": SECRET})
    assert cfg.cache.tenant_secret == SECRET and SECRET not in repr(cfg)
    path = tmp_path / "gw.yaml"
    path.write_text(f"cache: {{tenant_secret: {SECRET}}}\n")
    with pytest.raises(ConfigError, match="SMOLGATE_CACHE_TENANT_SECRET"):
        load_config(path, environ={})
    assert CacheConfig().tenant_secret == ""


def test_only_backend_replicas_get_the_tenant_and_only_their_verdict_is_relayed() -> None:
    """A real router (no engine) over two fake upstreams: one of kind backend, one of kind openai (a third party)."""
    fakes = {"ours": FakeUpstream("ours", cache_verdict="hit"), "theirs": FakeUpstream("theirs", cache_verdict="hit")}
    upstreams = Servers()
    urls = dict(zip(fakes, upstreams.start([f.app() for f in fakes.values()]), strict=True))
    config = from_mapping({
        "api_keys": ["sk-a"], "embeddings": False, "cache": {"backend": "off"},
        "models": {"ours": {"deployments": [{"kind": "backend", "base_url": f"{urls['ours']}/v1"}]},
                   "theirs": {"deployments": [{"kind": "openai", "base_url": f"{urls['theirs']}/v1"}]}},
    })  # fmt: skip
    config = replace(config, cache=replace(config.cache, tenant_secret=SECRET))
    gateway = Servers()
    (url,) = gateway.start([create_app(build_context(config, None))])
    try:
        verdicts = {}
        for model in fakes:
            body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
            response = httpx.post(f"{url}/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-a"})
            assert response.status_code == 200, response.text
            verdicts[model] = response.headers.get("x-cache")
        ours, theirs = fakes["ours"].headers[-1], fakes["theirs"].headers[-1]
        tenant = namespace("Bearer sk-a")
        assert (ours[TENANT_HEADER], ours[SIGNATURE_HEADER]) == (tenant, sign(SECRET, tenant))
        assert not {TENANT_HEADER, SIGNATURE_HEADER, "x-smolgate-cache"} & set(theirs)
        assert "sk-a" not in "".join(ours.values()) + "".join(theirs.values())  # the client's key stays here
        assert verdicts == {"ours": "hit", "theirs": None}
    finally:
        gateway.stop()
        upstreams.stop()
