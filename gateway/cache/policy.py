"""What may be cached: per-request controls (the `cache` body field and `x-smolgate-cache` header)
and the default policies (exact: deterministic requests; semantic: single-turn, tool-free too)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backend.engine.sampling_params import SamplingParams
from gateway.cache.config import CacheConfig
from gateway.errors import InvalidRequest

HEADER = "x-smolgate-cache"
_TOOL_FIELDS = ("tools", "functions", "tool_choice", "function_call", "response_format")
_TOOL_MESSAGE_KEYS = ("tool_calls", "function_call", "tool_call_id")


@dataclass(frozen=True)
class CacheControl:
    """One request's wishes: skip the lookup, skip the store, skip semantic matching, a TTL."""

    lookup: bool = True
    store: bool = True
    semantic: bool = True
    ttl_s: int | None = None


def _bool(raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, True)
    if not isinstance(value, bool):
        raise InvalidRequest(f"'cache.{key}' must be a boolean.", param=f"cache.{key}")
    return value


def _ttl(value: object, max_ttl_s: int, param: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(f"'{param}' must be a positive number of seconds.", param=param)
    return min(value, max_ttl_s)


def from_body(raw: object, max_ttl_s: int) -> CacheControl:
    """`"cache": {"lookup": false, "store": false, "semantic": false, "ttl": 60}` (all optional)."""
    if raw is None:
        return CacheControl()
    if not isinstance(raw, dict):
        raise InvalidRequest("'cache' must be an object with lookup, store, semantic and ttl.", param="cache")
    unknown = set(raw) - {"lookup", "store", "semantic", "ttl"}
    if unknown:
        raise InvalidRequest(f"Unrecognized argument in 'cache': {sorted(unknown)[0]}", param="cache")
    ttl = _ttl(raw.get("ttl"), max_ttl_s, "cache.ttl")
    return CacheControl(_bool(raw, "lookup"), _bool(raw, "store"), _bool(raw, "semantic"), ttl)


def from_header(value: str | None, base: CacheControl, max_ttl_s: int) -> CacheControl:
    """`x-smolgate-cache: no-lookup, no-store, no-semantic, ttl=60` narrows what the body said."""
    if not value:
        return base
    lookup, store, semantic, ttl = base.lookup, base.store, base.semantic, base.ttl_s
    for token in (t.strip().lower() for t in value.split(",") if t.strip()):
        if token == "no-lookup":
            lookup = False
        elif token == "no-store":
            store = False
        elif token == "no-semantic":
            semantic = False
        elif token.startswith("ttl=") and token[4:].isdigit():
            ttl = _ttl(int(token[4:]), max_ttl_s, HEADER)
        else:
            raise InvalidRequest(f"Unrecognized {HEADER} directive: {token!r}.", param=HEADER)
    return CacheControl(lookup, store, semantic, ttl)


def take_control(body: dict[str, Any], headers: Mapping[str, str], max_ttl_s: int) -> CacheControl:
    """Remove the `cache` extension from the body (the OpenAI parser never sees it) and read both."""
    return from_header(headers.get(HEADER), from_body(body.pop("cache", None), max_ttl_s), max_ttl_s)


def deterministic(params: SamplingParams) -> bool:
    return params.temperature == 0.0 or params.seed is not None


def exact_allowed(cfg: CacheConfig, params: SamplingParams) -> bool:
    return not cfg.only_deterministic or deterministic(params)


def _tool_message(m: object) -> bool:
    return isinstance(m, dict) and (m.get("role") in ("tool", "function") or any(m.get(k) for k in _TOOL_MESSAGE_KEYS))


def _uses_tools(body: Mapping[str, Any], messages: list[dict[str, Any]]) -> bool:
    """Tools offered, a forced format, or a tool call / tool result anywhere in the conversation."""
    if any(body.get(k) not in (None, "none", {"type": "text"}) for k in _TOOL_FIELDS):
        return True
    raw = body.get("messages")
    return any(map(_tool_message, messages)) or (isinstance(raw, list) and any(map(_tool_message, raw)))


def semantic_allowed(cfg: CacheConfig, body: Mapping[str, Any], messages: list[dict[str, Any]], params: SamplingParams) -> bool:
    """Conservative: deterministic, tool-free, no logprobs, last message from the user, and
    single-turn (system prompts only before it) unless multi-turn is configured."""
    if not cfg.semantic or not deterministic(params) or params.logprobs is not None or _uses_tools(body, messages):
        return False
    if not messages or messages[-1].get("role") != "user":
        return False
    earlier = {m.get("role") for m in messages[:-1]}
    return cfg.semantic_multi_turn or earlier <= {"system", "developer"}
