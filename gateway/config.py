"""Gateway configuration: frozen dataclasses from one YAML file plus environment overrides.

Precedence, lowest first: defaults < YAML file < environment < command-line flags.
The environment is read here and nowhere else in the gateway.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from backend.config import EngineConfig, engine_config_from_env
from gateway.batches.config import BatchesConfig
from gateway.cache.config import CacheConfig
from gateway.routing_config import KeyPolicy, RoutingConfig, RoutingConfigError, parse_key, parse_routing

ENV_PREFIX = "SMOLGATE_"

DEFAULT_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "gpt-4o-mini": "SmolLM2-135M-Instruct",
        "gpt-4o": "SmolLM2-135M-Instruct",
        "gpt-4.1-mini": "SmolLM2-135M-Instruct",
        "gpt-3.5-turbo": "SmolLM2-135M-Instruct",
        "gpt-3.5-turbo-instruct": "SmolLM2-135M-Instruct",
        "text-embedding-3-small": "all-MiniLM-L6-v2",
        "text-embedding-ada-002": "all-MiniLM-L6-v2",
    }
)


class ConfigError(ValueError):
    """The configuration file or an environment variable is invalid."""


@dataclass(frozen=True)
class GatewayConfig:
    """Everything the gateway needs; `engine` is passed on to the embedded engine untouched."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # empty: no authentication
    # API key -> default request priority (vLLM's convention: lower is served first; a request's own wins)
    api_key_priorities: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}), repr=False)
    model_aliases: Mapping[str, str] = field(default_factory=lambda: DEFAULT_ALIASES)
    max_body_bytes: int = 8 * 1024 * 1024
    retry_after_s: int = 1
    log_level: str = "info"
    access_log: bool = True
    embeddings: bool = True  # serve /v1/embeddings with all-MiniLM-L6-v2
    embedding_model: str = ""  # HF directory; "" means the default fetched model
    # auto (bfloat16 where native, else float16 weights) | float32 | bfloat16 | float16 | int8 (W8A8 C kernel, x86 AVX2)
    embedding_dtype: str = "auto"
    sse_ping_s: float = 15.0
    # Operations (README: Operations): shutdown drain, admission and timeouts against stuck clients.
    drain_timeout_s: float = 30.0  # on SIGTERM, in-flight requests get this long to finish
    max_concurrent_requests: int = 1024  # /v1/ requests in progress; beyond it 429 + Retry-After (0: no limit)
    body_timeout_s: float = 30.0  # a request body must arrive within this long (else 408)
    stream_send_timeout_s: float = 60.0  # a stream whose client reads nothing this long is ended
    # Idle keep-alive connections are closed after this long. Longer than clients' own idle expiry (httpx and
    # so the OpenAI SDK: 5 s), so a client never sends a request on a connection the server is closing.
    keep_alive_s: float = 65.0
    cache: CacheConfig = field(default_factory=CacheConfig)  # the response cache (gateway/cache/)
    batches: BatchesConfig = field(default_factory=BatchesConfig)  # Files and Batch APIs (gateway/batches/)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Routing (gateway/router.py): empty `routing.models` = serve the embedded engine only, as always.
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    key_policies: tuple[KeyPolicy, ...] = field(default=(), repr=False)  # api_keys given as mappings

    def accepted_keys(self) -> tuple[str, ...]:
        return self.api_keys + tuple(p.key for p in self.key_policies)


_SCALAR_ENV = {
    "max_body_bytes": "MAX_BODY_BYTES",
    "retry_after_s": "RETRY_AFTER_S",
    "log_level": "LOG_LEVEL",
    "access_log": "ACCESS_LOG",
    "embeddings": "EMBEDDINGS",
    "embedding_model": "EMBEDDING_MODEL",
    "embedding_dtype": "EMBEDDING_DTYPE",
    "sse_ping_s": "SSE_PING_S",
    "drain_timeout_s": "DRAIN_TIMEOUT_S",
    "max_concurrent_requests": "MAX_CONCURRENT_REQUESTS",
    "body_timeout_s": "BODY_TIMEOUT_S",
    "stream_send_timeout_s": "STREAM_SEND_TIMEOUT_S",
    "keep_alive_s": "KEEP_ALIVE_S",
}


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Defaults, then the YAML file (`path` or $SMOLGATE_CONFIG), then environment overrides."""
    env = os.environ if environ is None else environ
    path = path or env.get(f"{ENV_PREFIX}CONFIG") or None
    cfg = from_mapping(_read_yaml(Path(path)), env) if path else GatewayConfig()
    return apply_env(cfg, env)


def _read_yaml(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


_ROUTING_KEYS = {"models", "fallbacks", "router", "auto"}


def from_mapping(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Build a GatewayConfig from parsed YAML, checking every key and type.

    `env` supplies the secrets the routing sections name (api_key_env, key_env)."""
    env = {} if env is None else env
    base = GatewayConfig()
    known = ({f.name for f in fields(base)} - {"routing", "key_policies"}) | _ROUTING_KEYS
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown config keys: {sorted(unknown)}")
    changes: dict[str, Any] = {}
    try:
        changes["routing"] = parse_routing({k: v for k, v in data.items() if k in _ROUTING_KEYS}, env)
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc
    for name, value in data.items():
        if name in _ROUTING_KEYS:
            continue
        if name == "api_keys":
            changes["api_keys"], changes["key_policies"] = _api_keys(value, env)
        elif name == "engine":
            changes[name] = _engine_from_mapping(value)
        elif name == "cache":
            changes[name] = _cache_from_mapping(value)
        elif name == "batches":
            changes[name] = _batches(value)
        elif name == "model_aliases":
            changes[name] = _str_mapping(name, value)
        elif name == "api_key_priorities":
            changes[name] = _int_mapping(name, value)
        else:
            changes[name] = _coerce(name, value, getattr(base, name))
    return replace(base, **changes)


def _engine_from_mapping(value: object) -> EngineConfig:
    if not isinstance(value, dict):
        raise ConfigError("engine must be a mapping of EngineConfig fields")
    base = EngineConfig()
    known = {f.name for f in fields(base)}
    unknown = set(value) - known
    if unknown:
        raise ConfigError(f"unknown engine config keys: {sorted(unknown)}")
    return replace(base, **{k: _coerce(f"engine.{k}", v, getattr(base, k)) for k, v in value.items()})


def _cache_from_mapping(value: object) -> CacheConfig:
    if not isinstance(value, dict):
        raise ConfigError("cache must be a mapping of CacheConfig fields")
    base = CacheConfig()
    unknown = set(value) - {f.name for f in fields(base)}
    if unknown:
        raise ConfigError(f"unknown cache config keys: {sorted(unknown)}")
    return _valid_cache(base, {k: _coerce(f"cache.{k}", v, getattr(base, k)) for k, v in value.items()})


def _valid_cache(base: CacheConfig, changes: dict[str, Any]) -> CacheConfig:
    try:
        return replace(base, **changes)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _cache_from_env(cfg: CacheConfig, env: Mapping[str, str]) -> CacheConfig:
    """SMOLGATE_CACHE_<FIELD> (e.g. SMOLGATE_CACHE_BACKEND=redis, SMOLGATE_CACHE_REDIS_URL)."""
    changes: dict[str, Any] = {}
    for f in fields(cfg):
        name = f"{ENV_PREFIX}CACHE_{f.name.upper()}"
        if name in env:
            changes[f.name] = _parse_env(name, env[name], getattr(cfg, f.name))
    return _valid_cache(cfg, changes) if changes else cfg


def _batches(value: object, env: Mapping[str, str] | None = None, base: BatchesConfig | None = None) -> BatchesConfig:
    """The `batches:` mapping (YAML), or with `env` the SMOLGATE_BATCHES_<FIELD> overrides of `base`."""
    base = base or BatchesConfig()
    if env is not None:
        names = {f.name: f"{ENV_PREFIX}BATCHES_{f.name.upper()}" for f in fields(base)}
        changes = {k: _parse_env(n, env[n], getattr(base, k)) for k, n in names.items() if n in env}
    elif isinstance(value, dict):
        unknown = set(value) - {f.name for f in fields(base)}
        if unknown:
            raise ConfigError(f"unknown batches config keys: {sorted(unknown)}")
        changes = {k: _coerce(f"batches.{k}", v, getattr(base, k)) for k, v in value.items()}
    else:
        raise ConfigError("batches must be a mapping of BatchesConfig fields")
    try:
        return replace(base, **changes) if changes else base
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _coerce(name: str, value: object, like: object) -> Any:
    if isinstance(like, bool):
        ok = isinstance(value, bool)
    elif isinstance(like, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(like, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value  # type: ignore[arg-type]
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{name} must be of type {type(like).__name__}, got {value!r}")
    return value


def _api_keys(value: object, env: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[KeyPolicy, ...]]:
    """Plain strings (every model, no limits) and mappings (KeyPolicy: models, rpm, tpm)."""
    items = [value] if isinstance(value, str | dict) else value
    if not isinstance(items, list):
        raise ConfigError("api_keys must be a list of keys or key mappings")
    plain = [k for k in items if not isinstance(k, dict)]
    try:
        policies = tuple(parse_key(f"api_keys[{i}]", k, env) for i, k in enumerate(items) if isinstance(k, dict))
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc
    return (_str_tuple("api_keys", plain) if plain else ()), policies


def _str_tuple(name: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{name} must be a list of non-empty strings")
    return tuple(value)


def _str_mapping(name: str, value: object) -> Mapping[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigError(f"{name} must map strings to strings")
    return MappingProxyType(dict(value))


def _int_mapping(name: str, value: object) -> Mapping[str, int]:
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
    )
    if not ok:
        raise ConfigError(f"{name} must map API keys to integer priorities")
    return MappingProxyType(dict(value))  # type: ignore[arg-type]


def _parse_priorities(raw: str) -> Mapping[str, int]:
    """`key=priority,key2=priority2` (the keys themselves may not contain ',')."""
    pairs = [p.strip() for p in raw.split(",") if p.strip()]
    try:
        return MappingProxyType({k.strip(): int(v) for k, v in (p.rsplit("=", 1) for p in pairs)})
    except ValueError as exc:
        raise ConfigError(f"{ENV_PREFIX}API_KEY_PRIORITIES must look like 'key=0,key2=10'") from exc


def apply_env(cfg: GatewayConfig, env: Mapping[str, str]) -> GatewayConfig:
    """HOST, PORT and SMOLGATE_* variables override the file; engine fields use backend's names."""
    changes: dict[str, Any] = {}
    if "HOST" in env:
        changes["host"] = env["HOST"]
    if "PORT" in env:
        changes["port"] = _parse_env("PORT", env["PORT"], cfg.port)
    keys = env.get(f"{ENV_PREFIX}API_KEYS", env.get(f"{ENV_PREFIX}API_KEY"))
    if keys is not None:
        changes["api_keys"] = tuple(k.strip() for k in keys.split(",") if k.strip())
    if f"{ENV_PREFIX}API_KEY_PRIORITIES" in env:
        changes["api_key_priorities"] = _parse_priorities(env[f"{ENV_PREFIX}API_KEY_PRIORITIES"])
    if f"{ENV_PREFIX}MODEL_ALIASES" in env:
        changes["model_aliases"] = _parse_aliases(env[f"{ENV_PREFIX}MODEL_ALIASES"])
    for name, suffix in _SCALAR_ENV.items():
        if f"{ENV_PREFIX}{suffix}" in env:
            changes[name] = _parse_env(f"{ENV_PREFIX}{suffix}", env[f"{ENV_PREFIX}{suffix}"], getattr(cfg, name))
    changes["cache"] = _cache_from_env(cfg.cache, env)
    changes["batches"] = _batches(None, env, cfg.batches)
    if f"{ENV_PREFIX}ROUTER_REDIS_URL" in env:  # rate-limit counters shared by replicas
        router = replace(cfg.routing.router, redis_url=env[f"{ENV_PREFIX}ROUTER_REDIS_URL"])
        changes["routing"] = replace(cfg.routing, router=router)
    changes["engine"] = engine_config_from_env(cfg.engine, dict(env))
    return replace(cfg, **changes)


def _parse_env(name: str, raw: str, like: object) -> Any:
    try:
        if isinstance(like, bool):
            return raw.strip().lower() in {"1", "true", "yes", "on"}
        if isinstance(like, int):
            return int(raw)
        if isinstance(like, float):
            return float(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}={raw!r} is not a valid {type(like).__name__}") from exc
    return raw


def _parse_aliases(raw: str) -> Mapping[str, str]:
    """`alias=model,alias2=model2`; an empty string clears the aliases."""
    pairs = [p.strip() for p in raw.split(",") if p.strip()]
    if not all("=" in p for p in pairs):
        raise ConfigError(f"{ENV_PREFIX}MODEL_ALIASES must look like 'alias=model,alias2=model2'")
    return MappingProxyType({a.strip(): m.strip() for a, m in (p.split("=", 1) for p in pairs)})
