"""Tenant namespaces without a server: what the router forwards to a backend replica and what a backend trusts
(gateway/cache/tenancy.py), and where the shared secret may come from. The real-process version of all this is
tests/test_tenancy_topology.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cache.config import CacheConfig
from gateway.cache.keys import namespace
from gateway.cache.tenancy import ROUTED_PREFIX, SIGNATURE_HEADER, TENANT_HEADER, forwarded_headers, request_namespace, sign
from gateway.config import ConfigError, load_config

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
    assert request_namespace(signed, "") == "public"  # a backend without the secret trusts no router
    assert request_namespace(signed, "another") == "public"
    assert request_namespace({TENANT_HEADER: tenant}, SECRET) == "public"
    forged = {TENANT_HEADER: tenant, SIGNATURE_HEADER: sign("guess", tenant), "authorization": "Bearer x"}
    assert request_namespace(forged, SECRET) == namespace("Bearer x")
    # a signature for one tenant does not carry over to another
    assert request_namespace({**signed, TENANT_HEADER: namespace("Bearer sk-b")}, SECRET) == "public"
    # a client's own key sent straight to the backend never lands in a routed namespace
    assert not request_namespace({"authorization": "Bearer sk-a"}, SECRET).startswith(ROUTED_PREFIX)


def test_the_secret_comes_from_the_environment_only(tmp_path: Path) -> None:
    cfg = load_config(None, environ={"SMOLGATE_CACHE_TENANT_SECRET": SECRET})
    assert cfg.cache.tenant_secret == SECRET and SECRET not in repr(cfg)
    path = tmp_path / "gw.yaml"
    path.write_text(f"cache: {{tenant_secret: {SECRET}}}\n")
    with pytest.raises(ConfigError, match="SMOLGATE_CACHE_TENANT_SECRET"):
        load_config(path, environ={})
    assert CacheConfig().tenant_secret == ""
