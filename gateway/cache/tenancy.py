"""Tenants in every topology: the layer that authenticates API keys owns the cache namespace.

- One process (gateway + embedded engine, or a router's deployment of kind `embedded`): the namespace is derived
  from the client's own `Authorization` header (`keys.namespace`).
- Behind the router (`docker compose up`: gateway -> backend replicas): the backends never see the client's key,
  only the deployment's. The router signs the client's namespace with `cache.tenant_secret` (a secret shared by the
  router and its backends, from the environment: `SMOLGATE_CACHE_TENANT_SECRET`) and sends both in
  `x-smolgate-tenant` / `x-smolgate-tenant-signature` (HMAC-SHA256; the secret itself never travels). A backend
  configured with the same secret caches that request under `router:<tenant>`. A tenant header it cannot verify (no
  signature, a wrong one, or no secret of its own) turns the cache off for that request: a client sending the header
  straight to a backend reaches no tenant's entries, and a backend left without the router's secret does not pool
  every tenant in one namespace. Requests without the header keep the namespace of their own `Authorization`,
  which never starts with `router:`.
- A router without a secret cannot vouch for a tenant: it tells its backends not to cache the request at all
  (`x-smolgate-cache: no-lookup, no-store`), rather than let every tenant share the deployment's one namespace.

Only deployments of kind `backend` (this project's replicas) get these headers: never a third-party API.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from gateway.cache.keys import namespace
from gateway.cache.policy import HEADER as CACHE_HEADER

TENANT_HEADER = "x-smolgate-tenant"
SIGNATURE_HEADER = "x-smolgate-tenant-signature"
ROUTED_PREFIX = "router:"
_NO_CACHE = "no-lookup, no-store"
_MAX_TENANT = 128


def sign(secret: str, tenant: str) -> str:
    return hmac.new(secret.encode(), tenant.encode(), hashlib.sha256).hexdigest()


def forwarded_headers(secret: str, client: Mapping[str, str]) -> dict[str, str]:
    """What the router adds to a request it sends to a backend replica, from the client's request headers."""
    directives = client.get(CACHE_HEADER, "").strip()
    if not secret:  # no way to tell tenants apart at the backend: it must not cache this request
        return {CACHE_HEADER: f"{directives}, {_NO_CACHE}" if directives else _NO_CACHE}
    tenant = namespace(client.get("authorization"))
    headers = {TENANT_HEADER: tenant, SIGNATURE_HEADER: sign(secret, tenant)}
    if directives:  # the client's own narrowing directives still apply at the backend
        headers[CACHE_HEADER] = directives
    return headers


def request_namespace(headers: Mapping[str, str], secret: str) -> str | None:
    """The namespace a request's cache entries live in (see the module docstring); None: a tenant header that does
    not verify, so the request must neither read nor write the cache."""
    if TENANT_HEADER not in headers:
        return namespace(headers.get("authorization"))
    tenant = headers[TENANT_HEADER]
    signature = (headers.get(SIGNATURE_HEADER) or "").encode()
    if secret and 0 < len(tenant) <= _MAX_TENANT and hmac.compare_digest(signature, sign(secret, tenant).encode()):
        return ROUTED_PREFIX + tenant
    return None
