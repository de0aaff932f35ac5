"""On-disk layout, shared by the files and batch stores: one directory per tenant (a hash of the API key,
never the key itself), atomic JSON writes, and ids that stay unique across restarts."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.keys.config import SHA256_PREFIX

ANONYMOUS = "anonymous"  # the tenant of a gateway without API keys


def tenant_of(authorization: str | None, keys_configured: bool) -> str:
    """The tenant an `Authorization: Bearer KEY` header names: a hash of KEY (the key is never stored)."""
    if not keys_configured or not authorization:
        return ANONYMOUS
    scheme, _, key = authorization.partition(" ")
    key = key.strip() if scheme.lower() == "bearer" else ""
    return hashlib.sha256(key.encode()).hexdigest()[:32] if key else ANONYMOUS


def tenant_of_key(key: str) -> str:
    """`tenant_of` for a configured key (plain, or `sha256:<hex>`: the same digest, so the same tenant)."""
    if key.startswith(SHA256_PREFIX):
        return key[len(SHA256_PREFIX) :][:32].lower()
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def new_id(prefix: str) -> str:
    """24 hex digits that sort by creation time (nanoseconds, then 8 random ones): lists are ordered by id."""
    return f"{prefix}{time.time_ns():016x}{secrets.token_hex(4)}"


def write_json(path: Path, obj: Any) -> None:
    """Write-then-rename: a reader (or a restart after a kill) sees the old or the new file, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(obj))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())
