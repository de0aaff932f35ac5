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
from typing import TYPE_CHECKING, Any, TypeVar

from backend.config import (
    ConfigError,
    EngineConfig,
    coerce,
    engine_config_from_env,
    engine_config_from_mapping,
    read_config_file,
)
from gateway.batches.config import BatchesConfig
from gateway.cache.config import CacheConfig
from gateway.keys.config import KeyLimits, KeyPolicy
from gateway.routing.config import (
    RoutingConfig,
    RoutingConfigError,
    check_key,
    parse_key,
    parse_limits,
    parse_routing,
    parse_secret_entry,
)
from gateway.spend.config import LedgerConfig, Price, SpendConfig, TeamBudget
from gateway.tracing.config import TracesConfig

if TYPE_CHECKING:
    from _typeshed import DataclassInstance  # noqa: V104  # named in _Section's bound (a string: annotations are lazy)

ENV_PREFIX = "SMOLGATE_"

# the models `make serve` serves by default, by kind: the shipped aliases below name them (gateway/aliases.py points
# them at the served model of that kind when another one is served)
DEFAULT_MODELS: Mapping[str, str] = MappingProxyType({"SmolLM2-135M-Instruct": "chat", "all-MiniLM-L6-v2": "embedding"})
DEFAULT_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "gpt-4o-mini": "SmolLM2-135M-Instruct",
        "gpt-4o": "SmolLM2-135M-Instruct",
        "gpt-4.1-mini": "SmolLM2-135M-Instruct",
        "gpt-3.5-turbo": "SmolLM2-135M-Instruct",
        "gpt-3.5-turbo-instruct": "SmolLM2-135M-Instruct",
        "text-embedding-3-small": "all-MiniLM-L6-v2",
        "text-embedding-ada-002": "all-MiniLM-L6-v2",
        # the model ids Claude Code and Codex CLI ask for (an alias ending in `*` matches every name it starts)
        "claude-*": "SmolLM2-135M-Instruct",
        "gpt-5*": "SmolLM2-135M-Instruct",
        "codex-*": "SmolLM2-135M-Instruct",
    }
)


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
    # Operations (docs/deployment.md): shutdown drain, admission and timeouts against stuck clients.
    drain_timeout_s: float = 30.0  # on SIGTERM, in-flight requests get this long to finish
    max_concurrent_requests: int = 1024  # /v1/ requests in progress; beyond it 429 + Retry-After (0: no limit)
    body_timeout_s: float = 30.0  # a request body must arrive within this long (else 408)
    stream_send_timeout_s: float = 60.0  # a stream whose client reads nothing this long is ended
    # Idle keep-alive connections are closed after this long. Longer than clients' own idle expiry (httpx and
    # so the OpenAI SDK: 5 s), so a client never sends a request on a connection the server is closing.
    keep_alive_s: float = 65.0
    # Refuse every request field this server does not act on, hints included (gateway/protocol/declared.py); off:
    # hints that change nothing in the answer (metadata, effort, context management...) are accepted and ignored
    strict_params: bool = False
    # Sampling values for chat requests that set none, like vLLM's --override-generation-config: clients such as
    # Claude Code and Codex CLI send no temperature, and `{temperature: 0}` makes their answers greedy (repeatable)
    sampling_defaults: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    cache: CacheConfig = field(default_factory=CacheConfig)  # the response cache (gateway/cache/)
    batches: BatchesConfig = field(default_factory=BatchesConfig)  # Files and Batch APIs (gateway/batches/)
    traces: TracesConfig = field(default_factory=TracesConfig)  # OpenTelemetry traces (gateway/tracing/)
    engine: EngineConfig = field(default_factory=EngineConfig)
    # Routing (gateway/routing/router.py): empty `routing.models` = serve the embedded engine only, as always. The
    # `models:` list form: several embedded models, each its own engine (ModelRoute.engine); `engine` then only
    # gives the fields their entries leave out.
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    key_policies: tuple[KeyPolicy, ...] = field(default=(), repr=False)  # api_keys given as mappings
    # Security (docs/security.md): the limits of every key that sets none itself (and of anonymous requests
    # when no key is configured), and the keys that may read /metrics and /v1/stats.
    key_defaults: KeyLimits = field(default_factory=KeyLimits)
    admin_keys: tuple[str, ...] = field(default=(), repr=False)  # keys or sha256:<hex>; none = only without api_keys
    # Spend (docs/spend.md): prices, team budgets and the ledger (the `spend:` and `ledger:` sections)
    spend: SpendConfig = field(default_factory=SpendConfig)

    def accepted_keys(self) -> tuple[str, ...]:
        return self.api_keys + tuple(p.key for p in self.key_policies)

    def policies(self) -> tuple[KeyPolicy, ...]:
        """Every accepted key with its policy: plain keys get `key_defaults` (and their `api_key_priorities`)."""
        out = []
        for i, key in enumerate(self.api_keys):
            long_literal = len(key) >= 16 and not key.startswith("sha256:")
            name = "…" + key[-4:] if long_literal else f"key{i}"  # the dashboard's label: never a short key
            limits = replace(self.key_defaults, priority=self.api_key_priorities.get(key, self.key_defaults.priority))
            out.append(KeyPolicy.of(name, key, limits))
        for p in self.key_policies:
            out.append(replace(p, priority=self.api_key_priorities[p.key]) if p.key in self.api_key_priorities else p)
        return tuple(out)

    def secrets(self) -> tuple[str, ...]:
        """Every secret this configuration holds (client, admin and upstream keys): never logged."""
        upstream = [d.api_key for m in self.routing.models for d in m.deployments if d.api_key]
        ledger = [self.spend.ledger.url] if "@" in self.spend.ledger.url else []  # it may hold a password
        return tuple(
            s for s in (*self.accepted_keys(), *self.admin_keys, *upstream, *ledger) if s and not s.startswith("sha256:")
        )


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
    "strict_params": "STRICT_PARAMS",
}


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Defaults, then the YAML file (`path` or $SMOLGATE_CONFIG), then environment overrides."""
    env = os.environ if environ is None else environ
    path = path or env.get(f"{ENV_PREFIX}CONFIG") or None
    cfg = from_mapping(read_config_file(Path(path)), env) if path else GatewayConfig()
    return apply_env(cfg, env)


_ROUTING_KEYS = {"models", "fallbacks", "router", "auto"}


def from_mapping(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Build a GatewayConfig from parsed YAML, checking every key and type.

    `env` supplies the secrets the routing sections name (api_key_env, key_env)."""
    env = {} if env is None else env
    base = GatewayConfig()
    known = ({f.name for f in fields(base)} - {"routing", "key_policies"}) | _ROUTING_KEYS | {"ledger"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"unknown config keys: {sorted(unknown)}")
    changes: dict[str, Any] = {}
    # the `models:` list's entries start from the `engine:` section (what they leave out, they share)
    engine = engine_config_from_mapping(data["engine"]) if "engine" in data else base.engine
    try:
        changes["routing"] = parse_routing({k: v for k, v in data.items() if k in _ROUTING_KEYS}, env, engine)
        defaults = parse_limits("key_defaults", data.get("key_defaults", {}), KeyLimits())
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc
    changes["key_defaults"] = defaults
    if "spend" in data or "ledger" in data:
        changes["spend"] = _spend(data.get("spend", {}), data.get("ledger", {}))
    for name, value in data.items():
        if name in _ROUTING_KEYS or name in ("key_defaults", "spend", "ledger"):
            continue
        if name == "api_keys":
            changes["api_keys"], changes["key_policies"] = _api_keys(value, env, defaults)
        elif name == "admin_keys":
            changes["admin_keys"] = _admin_keys(value, env)
        elif name == "engine":
            changes[name] = engine
        elif name == "cache":
            changes[name] = _cache_from_mapping(value)
        elif name == "batches":
            changes[name] = _batches(value)
        elif name == "traces":
            changes[name] = _traces(value)
        elif name == "model_aliases":
            changes[name] = _str_mapping(name, value)
        elif name == "api_key_priorities":
            changes[name] = _int_mapping(name, value)
        elif name == "sampling_defaults":
            changes[name] = _sampling_defaults(value)
        else:
            changes[name] = coerce(name, value, getattr(base, name))
    return replace(base, **changes)


def _cache_from_mapping(value: object) -> CacheConfig:
    if not isinstance(value, dict):
        raise ConfigError("cache must be a mapping of CacheConfig fields")
    base = CacheConfig()
    unknown = set(value) - {f.name for f in fields(base)}
    if unknown:
        raise ConfigError(f"unknown cache config keys: {sorted(unknown)}")
    if "tenant_secret" in value:
        raise ConfigError("cache.tenant_secret is a secret: set it in the environment (SMOLGATE_CACHE_TENANT_SECRET)")
    return _replaced(base, {k: coerce(f"cache.{k}", v, getattr(base, k)) for k, v in value.items()})


def _section(name: str, value: object, base: Any) -> dict[str, Any]:
    """A YAML section's fields (`name:` a mapping of `base`'s dataclass fields), each coerced to its field's type."""
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a mapping of {type(base).__name__} fields")
    unknown = set(value) - {f.name for f in fields(base)}
    if unknown:
        raise ConfigError(f"unknown {name} config keys: {sorted(unknown)}")
    return {k: coerce(f"{name}.{k}", v, getattr(base, k)) for k, v in value.items()}


_Section = TypeVar("_Section", bound="DataclassInstance")  # a config section's frozen dataclass


def _replaced(base: _Section, changes: dict[str, Any]) -> _Section:
    """`base` with `changes`; a value its own checks refuse (ValueError) is a ConfigError."""
    try:
        return replace(base, **changes) if changes else base
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _cache_from_env(cfg: CacheConfig, env: Mapping[str, str]) -> CacheConfig:
    """SMOLGATE_CACHE_<FIELD> (e.g. SMOLGATE_CACHE_BACKEND=redis, SMOLGATE_CACHE_REDIS_URL)."""
    changes: dict[str, Any] = {}
    for f in fields(cfg):
        name = f"{ENV_PREFIX}CACHE_{f.name.upper()}"
        if name in env:
            changes[f.name] = _parse_env(name, env[name], getattr(cfg, f.name))
    return _replaced(cfg, changes)


def _batches(value: object, env: Mapping[str, str] | None = None, base: BatchesConfig | None = None) -> BatchesConfig:
    """The `batches:` mapping (YAML), or with `env` the SMOLGATE_BATCHES_<FIELD> overrides of `base`."""
    base = base or BatchesConfig()
    if env is not None:
        names = {f.name: f"{ENV_PREFIX}BATCHES_{f.name.upper()}" for f in fields(base)}
        changes = {k: _parse_env(n, env[n], getattr(base, k)) for k, n in names.items() if n in env}
    else:
        changes = _section("batches", value, base)
    return _replaced(base, changes)


def _traces(value: object, env: Mapping[str, str] | None = None, base: TracesConfig | None = None) -> TracesConfig:
    """The `traces:` mapping (YAML), or with `env` OpenTelemetry's standard variables over `base`:
    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (the traces URL as is) or OTEL_EXPORTER_OTLP_ENDPOINT (a base URL: + /v1/traces),
    OTEL_SERVICE_NAME, OTEL_SDK_DISABLED=true (no tracing); and SMOLGATE_TRACES_CONTENT."""
    base = base or TracesConfig()
    changes: dict[str, Any] = {}
    if env is not None:
        if env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            changes["endpoint"] = env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].strip()
        elif env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            changes["endpoint"] = env["OTEL_EXPORTER_OTLP_ENDPOINT"].strip().rstrip("/") + "/v1/traces"
        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            changes["endpoint"] = ""
        if env.get("OTEL_SERVICE_NAME"):
            changes["service_name"] = env["OTEL_SERVICE_NAME"]
        if f"{ENV_PREFIX}TRACES_CONTENT" in env:
            changes["content"] = _parse_env(f"{ENV_PREFIX}TRACES_CONTENT", env[f"{ENV_PREFIX}TRACES_CONTENT"], False)
    else:
        changes = _section("traces", value, base)
    return _replaced(base, changes)


def _number(where: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where} must be a non-negative number, got {value!r}")
    return float(value)


def _spend(spend: object, ledger: object) -> SpendConfig:
    """`spend:` (currency, cache_hit_factor, shipped_prices, prices, teams) and `ledger:` (enabled, url, dir)."""
    if not isinstance(spend, dict) or not isinstance(ledger, dict):
        raise ConfigError("spend and ledger must be mappings")
    base = SpendConfig()
    unknown = set(spend) - {f.name for f in fields(base)} | ({"ledger"} & set(spend))
    if unknown:
        raise ConfigError(f"unknown spend config keys: {sorted(unknown)}")
    changes: dict[str, Any] = {}
    for name, value in spend.items():
        if name == "prices":
            changes[name] = MappingProxyType({str(k): _price(f"spend.prices.{k}", v) for k, v in _mapping(name, value).items()})
        elif name == "teams":
            changes[name] = MappingProxyType({str(k): _team(f"spend.teams.{k}", v) for k, v in _mapping(name, value).items()})
        else:
            changes[name] = coerce(f"spend.{name}", value, getattr(base, name))
    changes["ledger"] = _replaced(LedgerConfig(), _section("ledger", ledger, LedgerConfig()))
    return _replaced(base, changes)


def _mapping(name: str, value: object) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"spend.{name} must be a mapping")
    return value


def _price(where: str, value: object) -> Price:
    """`{input: 2.5, output: 10, cached_input: 1.25}`, per 1M tokens."""
    if not isinstance(value, dict) or set(value) - {"input", "output", "cached_input"}:
        raise ConfigError(f"{where} must be {{input, output, cached_input}} per 1M tokens")
    cached = value.get("cached_input")
    return Price(_number(f"{where}.input", value.get("input", 0)), _number(f"{where}.output", value.get("output", 0)),
                 None if cached is None else _number(f"{where}.cached_input", cached))  # fmt: skip


def _team(where: str, value: object) -> TeamBudget:
    if not isinstance(value, dict) or set(value) - {"daily_budget", "monthly_budget"}:
        raise ConfigError(f"{where} must be {{daily_budget, monthly_budget}}")
    return TeamBudget(_number(f"{where}.daily_budget", value.get("daily_budget", 0)),
                      _number(f"{where}.monthly_budget", value.get("monthly_budget", 0)))  # fmt: skip


def _api_keys(value: object, env: Mapping[str, str], defaults: KeyLimits) -> tuple[tuple[str, ...], tuple[KeyPolicy, ...]]:
    """Plain strings (every model, `key_defaults`) and mappings (KeyPolicy: models, rpm, tpm, priority, caps);
    either may be `sha256:<hex>` of the key instead of the key."""
    items = [value] if isinstance(value, str | dict) else value
    if not isinstance(items, list):
        raise ConfigError("api_keys must be a list of keys or key mappings")
    plain = [k for k in items if not isinstance(k, dict)]
    try:
        policies = tuple(parse_key(f"api_keys[{i}]", k, env, defaults) for i, k in enumerate(items) if isinstance(k, dict))
        names = [p.name for p in policies]
        if len(set(names)) != len(names):
            raise RoutingConfigError(f"api_keys: two keys have the same name ({sorted(names)})")
        keys = tuple(check_key("api_keys", k) for k in _str_tuple("api_keys", plain)) if plain else ()
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc
    return keys, policies


def _admin_keys(value: object, env: Mapping[str, str]) -> tuple[str, ...]:
    """`admin_keys`: strings (a key or sha256:<hex>) or `{key_env: NAME}` mappings."""
    items = [value] if isinstance(value, str | dict) else value
    if not isinstance(items, list):
        raise ConfigError("admin_keys must be a list of keys or {key_env: NAME} mappings")
    try:
        return tuple(parse_secret_entry(f"admin_keys[{i}]", k, env) for i, k in enumerate(items))
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc


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


SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                         "frequency_penalty")  # fmt: skip


def _sampling_defaults(value: object) -> Mapping[str, float]:
    if not isinstance(value, dict):
        raise ConfigError("sampling_defaults must be a mapping, e.g. {temperature: 0}")
    for key, v in value.items():
        if key not in SAMPLING_DEFAULT_KEYS:
            raise ConfigError(f"sampling_defaults: unknown key {key!r} (one of {', '.join(SAMPLING_DEFAULT_KEYS)})")
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise ConfigError(f"sampling_defaults.{key} must be a number")
    return MappingProxyType(dict(value))


def _int_mapping(name: str, value: object) -> Mapping[str, int]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) for k, v in value.items()
    ):
        raise ConfigError(f"{name} must map API keys to integer priorities")
    return MappingProxyType(dict(value))


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
        changes["api_keys"] = _env_keys(f"{ENV_PREFIX}API_KEYS", keys)
    if f"{ENV_PREFIX}ADMIN_KEYS" in env:
        changes["admin_keys"] = _env_keys(f"{ENV_PREFIX}ADMIN_KEYS", env[f"{ENV_PREFIX}ADMIN_KEYS"])
    if f"{ENV_PREFIX}API_KEY_PRIORITIES" in env:
        changes["api_key_priorities"] = _parse_priorities(env[f"{ENV_PREFIX}API_KEY_PRIORITIES"])
    if f"{ENV_PREFIX}MODEL_ALIASES" in env:
        changes["model_aliases"] = _parse_aliases(env[f"{ENV_PREFIX}MODEL_ALIASES"])
    for name, suffix in _SCALAR_ENV.items():
        if f"{ENV_PREFIX}{suffix}" in env:
            changes[name] = _parse_env(f"{ENV_PREFIX}{suffix}", env[f"{ENV_PREFIX}{suffix}"], getattr(cfg, name))
    changes["cache"] = _cache_from_env(cfg.cache, env)
    changes["batches"] = _batches(None, env, cfg.batches)
    changes["traces"] = _traces(None, env, cfg.traces)
    if f"{ENV_PREFIX}LEDGER_URL" in env:  # e.g. a PostgreSQL URL with its password, kept out of the file
        try:
            ledger = replace(cfg.spend.ledger, url=env[f"{ENV_PREFIX}LEDGER_URL"])
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        changes["spend"] = replace(cfg.spend, ledger=ledger)
    if f"{ENV_PREFIX}ROUTER_REDIS_URL" in env:  # rate-limit counters shared by replicas
        router = replace(cfg.routing.router, redis_url=env[f"{ENV_PREFIX}ROUTER_REDIS_URL"])
        changes["routing"] = replace(cfg.routing, router=router)
    changes["engine"] = engine = engine_config_from_env(cfg.engine, dict(env))
    if cfg.routing.own_engines:  # the `models:` list: what an entry leaves out comes from the section and the environment
        routing = changes.get("routing", cfg.routing)
        models = tuple(replace(m, engine=m.engine.over(engine)) if m.engine else m for m in routing.models)
        changes["routing"] = replace(routing, models=models)
    return replace(cfg, **changes)


def _env_keys(name: str, raw: str) -> tuple[str, ...]:
    try:
        return tuple(check_key(name, k.strip()) for k in raw.split(",") if k.strip())
    except RoutingConfigError as exc:
        raise ConfigError(str(exc)) from exc


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
