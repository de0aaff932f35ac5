"""Routing configuration: models -> deployments, fallbacks, per-key policies, router and `auto` knobs.

Parsed from the `models`, `fallbacks`, `router`, `auto` sections and the mapping form of `api_keys`
in the gateway's YAML file. With no `models` section there is no routing: the gateway serves its
embedded engine exactly as before. `models` is either a mapping (model name -> deployments) or a list of
embedded models (`- {id, engine}`), each run by its own engine in this process. Secrets are never in the
file: `api_key_env` / `key_env` name environment variables, read here (the environment mapping is passed in,
as in gateway/config.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Literal

from backend.config import ConfigError, EngineConfig, engine_config_from_mapping
from gateway.keys.config import SHA256_PREFIX, KeyLimits, KeyPolicy

DeploymentKind = Literal["embedded", "openai", "backend"]
_KINDS = ("embedded", "openai", "backend")
_DISCOVERY = ("", "dns")


class RoutingConfigError(ValueError):
    """A routing section is invalid (gateway/config.py re-raises it as ConfigError)."""


@dataclass(frozen=True)
class DeploymentConfig:
    """One place a model runs: the embedded engine, or an OpenAI-compatible upstream.

    `backend` is an upstream that is another replica of this project's backend: it holds a prefix KV
    cache, so conversations stick to one replica (prefix affinity) unless it is overloaded.
    """

    kind: DeploymentKind = "openai"
    base_url: str = ""  # e.g. http://backend-1:8000/v1 (ends in /v1)
    api_key: str = field(default="", repr=False)  # read from api_key_env, never written in the file
    model: str = ""  # the upstream's model name; "" = the routed model's name (embedded: the engine's)
    name: str = ""  # for metrics and logs; default kind:base_url
    weight: float = 1.0
    timeout_s: float = 60.0  # whole non-streaming request
    connect_timeout_s: float = 3.0
    first_token_timeout_s: float = 30.0  # streaming: until the first event
    idle_timeout_s: float = 30.0  # streaming: between two events
    rpm: int = 0  # requests per minute through this deployment; 0 = unlimited
    tpm: int = 0  # tokens per minute
    max_connections: int = 64  # httpx pool size for this deployment
    prefix_affinity: bool = False  # default: true for kind backend
    # "" (base_url is one server) | dns (base_url's host names every replica, e.g. a Kubernetes headless Service: its
    # A records are re-resolved every router.discovery_interval_s, each address one replica: gateway/routing/discovery.py)
    discovery: str = ""

    @property
    def label(self) -> str:
        return self.name or (self.kind if self.kind == "embedded" else f"{self.kind}:{self.base_url}")


@dataclass(frozen=True)
class OwnEngine:
    """The engine of one entry of the `models:` list. `overrides`: the fields the entry sets itself; they win over
    the `engine:` section and the SMOLGATE_<FIELD> environment, which give every other field (gateway/config.py)."""

    config: EngineConfig
    overrides: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def over(self, base: EngineConfig) -> OwnEngine:
        return replace(self, config=replace(base, **self.overrides))


@dataclass(frozen=True)
class ModelRoute:
    name: str
    deployments: tuple[DeploymentConfig, ...]
    engine: OwnEngine | None = None  # a `models:` list entry: its embedded deployment runs this engine of its own


@dataclass(frozen=True)
class RouterConfig:
    num_retries: int = 2  # per deployment list of one model (attempts = 1 + num_retries)
    backoff_base_s: float = 0.1
    backoff_max_s: float = 2.0
    max_retry_after_s: float = 5.0  # honour an upstream's Retry-After up to this long, else move on
    cooldown_failures: int = 3  # consecutive failures that cool a deployment down
    cooldown_s: float = 15.0  # then one probe request is let through
    affinity_overload: int = 4  # leave the affinity replica when it has this many more in flight than the least loaded
    affinity_prefix_chars: int = 512  # how much of the conversation's start keys the affinity
    redis_url: str = ""  # rate-limit counters shared by gateway replicas; "" = in process
    redis_prefix: str = "smolgate:rl"
    tokenizer: str = ""  # tokenizer.json to count usage upstreams omit; "" = the default model's
    discovery_interval_s: float = 5.0  # deployments with `discovery: dns`: how often their name is re-resolved
    discovery_nameservers: str = ""  # "" = the system's (/etc/resolv.conf); else "host[:port],..." to ask instead


@dataclass(frozen=True)
class AutoConfig:
    """`model: "auto"`: requests scored harder than `threshold` go to `large`, the rest to `small`."""

    small: str = ""
    large: str = ""
    threshold: float = 0.5
    use_embeddings: bool = True  # kNN over labelled examples when an embedder is available
    embedding_base_url: str = ""  # an upstream's /v1 for the embeddings ("" = this gateway's embedder, if loaded)
    embedding_model: str = "all-MiniLM-L6-v2"

    @property
    def enabled(self) -> bool:
        return bool(self.small and self.large)


@dataclass(frozen=True)
class RoutingConfig:
    models: tuple[ModelRoute, ...] = ()
    fallbacks: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))
    router: RouterConfig = field(default_factory=RouterConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)

    @property
    def enabled(self) -> bool:
        return bool(self.models)

    def model(self, name: str) -> ModelRoute | None:
        return next((m for m in self.models if m.name == name), None)

    @property
    def needs_engine(self) -> bool:
        return any(d.kind == "embedded" for m in self.models for d in m.deployments)

    @property
    def own_engines(self) -> tuple[ModelRoute, ...]:
        """The `models:` list's models (each with an engine of its own), in the file's order."""
        return tuple(m for m in self.models if m.engine is not None)


def _dataclass_from(cls: type, where: str, value: object, skip: tuple[str, ...] = ()) -> Any:
    if not isinstance(value, dict):
        raise RoutingConfigError(f"{where} must be a mapping")
    base = cls()
    known = {f.name for f in fields(base)} - set(skip)
    unknown = set(value) - known
    if unknown:
        raise RoutingConfigError(f"unknown {where} keys: {sorted(unknown)}")
    return replace(base, **{k: _typed(f"{where}.{k}", v, getattr(base, k)) for k, v in value.items()})


def _typed(name: str, value: object, like: object) -> Any:
    if isinstance(like, bool):
        ok = isinstance(value, bool)
    elif isinstance(like, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif isinstance(like, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
        if ok and isinstance(value, int | float):  # (ok says so; the check tells the type checker)
            value = float(value)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise RoutingConfigError(f"{name} must be a non-negative {type(like).__name__}, got {value!r}")
    return value


def _secret(where: str, env_name: object, env: Mapping[str, str]) -> str:
    """The value of the environment variable `env_name`; unset or empty stops startup (never an empty secret)."""
    if not isinstance(env_name, str) or not env_name:
        raise RoutingConfigError(f"{where} must name an environment variable")
    value = env.get(env_name, "").strip()
    if not value:
        raise RoutingConfigError(f"{where}: environment variable {env_name} is not set or empty")
    return value


def parse_deployment(where: str, value: object, env: Mapping[str, str]) -> DeploymentConfig:
    if not isinstance(value, dict):
        raise RoutingConfigError(f"{where} must be a mapping")
    raw = dict(value)
    env_name = raw.pop("api_key_env", None)
    dep: DeploymentConfig = _dataclass_from(DeploymentConfig, where, raw, skip=("api_key",))
    if dep.kind not in _KINDS:
        raise RoutingConfigError(f"{where}.kind must be one of {list(_KINDS)}, got {dep.kind!r}")
    if dep.kind != "embedded" and not dep.base_url.startswith(("http://", "https://")):
        raise RoutingConfigError(f"{where}.base_url must be an http(s) URL ending in /v1")
    if dep.weight <= 0:
        raise RoutingConfigError(f"{where}.weight must be > 0")
    if dep.discovery not in _DISCOVERY or (dep.discovery and dep.kind == "embedded"):
        raise RoutingConfigError(f"{where}.discovery must be '' or 'dns' (with a base_url), got {dep.discovery!r}")
    changes: dict[str, Any] = {"base_url": dep.base_url.rstrip("/")}
    if env_name is not None:
        changes["api_key"] = _secret(f"{where}.api_key_env (deployment {dep.label!r})", env_name, env)
    if dep.kind == "backend" and "prefix_affinity" not in raw:
        changes["prefix_affinity"] = True
    return replace(dep, **changes)


_ENTRY_KEYS = ("id", "engine")


def parse_model_list(value: list[Any], base: EngineConfig) -> tuple[ModelRoute, ...]:
    """`models:` as a list of embedded models, `- {id: NAME, engine: {EngineConfig fields}}`: each served by its own
    engine (its model, quantization, chat template and KV budget); `base` (the `engine:` section) gives the fields an
    entry leaves out. The id is the name clients send, and the engine's served name."""
    if not value:
        raise RoutingConfigError("models: the list is empty (each entry is {id: NAME, engine: {...}})")
    routes: list[ModelRoute] = []
    for i, entry in enumerate(value):
        where = f"models[{i}]"
        if not isinstance(entry, dict):
            raise RoutingConfigError(f"{where} must be a mapping {{id: NAME, engine: {{...}}}}")
        unknown = set(entry) - set(_ENTRY_KEYS)
        if unknown:
            raise RoutingConfigError(f"unknown {where} keys: {sorted(map(str, unknown))} (an entry has {list(_ENTRY_KEYS)})")
        name = entry.get("id")
        if not isinstance(name, str) or not name.strip() or name == "auto":
            raise RoutingConfigError(f"{where}.id must be a non-empty model name ('auto' is reserved), got {name!r}")
        if any(r.name == name for r in routes):
            raise RoutingConfigError(f"models: two entries have the id {name!r}")
        raw = entry.get("engine", {})
        if not isinstance(raw, dict):
            raise RoutingConfigError(f"{where}.engine must be a mapping of engine fields")
        if raw.get("served_model_name", name) != name:
            raise RoutingConfigError(f"{where}.engine.served_model_name: the entry's id ({name!r}) is its served name")
        try:
            own = engine_config_from_mapping(raw)
        except ConfigError as exc:
            raise RoutingConfigError(f"{where} ({name}): {exc}") from None
        overrides = {k: getattr(own, k) for k in raw} | {"served_model_name": name}
        engine = OwnEngine(replace(base, **overrides), MappingProxyType(overrides))
        routes.append(ModelRoute(name, (DeploymentConfig(kind="embedded"),), engine))
    return tuple(routes)


def parse_models(value: object, env: Mapping[str, str], base: EngineConfig | None = None) -> tuple[ModelRoute, ...]:
    if isinstance(value, list):
        return parse_model_list(value, base or EngineConfig())
    if not isinstance(value, dict) or not value:
        raise RoutingConfigError("models must map model names to {deployments: [...]}, or list {id, engine} entries")
    routes = []
    for name, spec in value.items():
        if not isinstance(name, str) or not name or name == "auto":
            raise RoutingConfigError(f"models: invalid model name {name!r} ('auto' is reserved)")
        if not isinstance(spec, dict) or set(spec) - {"deployments"} or not isinstance(spec.get("deployments"), list):
            raise RoutingConfigError(f"models.{name} must be {{deployments: [...]}}")
        deps = tuple(parse_deployment(f"models.{name}.deployments[{i}]", d, env) for i, d in enumerate(spec["deployments"]))
        if not deps:
            raise RoutingConfigError(f"models.{name} needs at least one deployment")
        routes.append(ModelRoute(name, deps))
    return tuple(routes)


def parse_fallbacks(value: object) -> Mapping[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise RoutingConfigError("fallbacks must map a model name to a list of model names")
    out: dict[str, tuple[str, ...]] = {}
    for name, targets in value.items():
        if isinstance(targets, str):
            targets = [targets]
        if not isinstance(targets, list) or not all(isinstance(t, str) and t for t in targets):
            raise RoutingConfigError(f"fallbacks.{name} must be a list of model names")
        out[str(name)] = tuple(targets)
    return MappingProxyType(out)


_LIMIT_FIELDS = {f.name for f in fields(KeyLimits)}


def check_key(where: str, key: str) -> str:
    """A key as written in the configuration: the key itself, or `sha256:` and the 64 hex digits of its SHA-256."""
    if key.startswith(SHA256_PREFIX):
        digest = key[len(SHA256_PREFIX) :].strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise RoutingConfigError(f"{where}: a sha256: key needs the 64 hex digits of the key's SHA-256")
        return SHA256_PREFIX + digest
    return key


def parse_limits(where: str, value: object, base: KeyLimits) -> KeyLimits:
    """`key_defaults`, or the limit fields of one key mapping (the rest of `base` is kept)."""
    if not isinstance(value, dict):
        raise RoutingConfigError(f"{where} must be a mapping")
    unknown = set(value) - _LIMIT_FIELDS
    if unknown:
        raise RoutingConfigError(f"unknown {where} keys: {sorted(unknown)}")
    changes: dict[str, Any] = {}
    for k, v in value.items():
        if k == "priority":  # vLLM's convention: any 32-bit integer, lower = earlier
            if not isinstance(v, int) or isinstance(v, bool) or not -(2**31) <= v < 2**31:
                raise RoutingConfigError(f"{where}.priority must be a 32-bit integer, got {v!r}")
            changes[k] = v
        else:
            changes[k] = _typed(f"{where}.{k}", v, getattr(base, k))
    if changes.get("max_sequences", base.max_sequences) < 1:
        raise RoutingConfigError(f"{where}.max_sequences must be at least 1")
    return replace(base, **changes)


def parse_secret_entry(where: str, value: object, env: Mapping[str, str]) -> str:
    """A key given as `{key_env: NAME}` (preferred), `{key: literal}` or a string; `sha256:<hex>` is a hash."""
    if isinstance(value, str) and value:
        return check_key(where, value)
    if not isinstance(value, dict):
        raise RoutingConfigError(f"{where} must be a string or a mapping")
    if "key_env" in value:
        return check_key(where, _secret(f"{where}.key_env", value["key_env"], env))
    if isinstance(value.get("key"), str) and value["key"]:
        return check_key(where, value["key"])
    raise RoutingConfigError(f"{where} needs key_env (preferred) or key")


def parse_key(where: str, value: object, env: Mapping[str, str], defaults: KeyLimits | None = None) -> KeyPolicy:
    """`{key_env: NAME}` or `{key: literal or sha256:<hex>}`, optional name, models and any KeyLimits field."""
    if not isinstance(value, dict):
        raise RoutingConfigError(f"{where} must be a string or a mapping")
    raw = dict(value)
    key = parse_secret_entry(where, {k: raw.pop(k) for k in ("key_env", "key") if k in raw}, env)
    models = raw.pop("models", [])
    if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
        raise RoutingConfigError(f"{where}.models must be a list of model names")
    name = raw.pop("name", "") or f"key{where.rsplit('[', 1)[-1].rstrip(']')}"
    team = raw.pop("team", "")
    if not isinstance(team, str):
        raise RoutingConfigError(f"{where}.team must be a team name")
    limits = parse_limits(where, raw, defaults or KeyLimits())
    return KeyPolicy.of(str(name), key, limits, tuple(models), team=team)


def parse_routing(data: Mapping[str, Any], env: Mapping[str, str], engine: EngineConfig | None = None) -> RoutingConfig:
    """The routing sections of the YAML mapping (any may be absent); `engine`: the `engine:` section, which the
    `models:` list's entries start from."""
    cfg = RoutingConfig()
    if "models" in data:
        cfg = replace(cfg, models=parse_models(data["models"], env, engine))
    if "fallbacks" in data:
        cfg = replace(cfg, fallbacks=parse_fallbacks(data["fallbacks"]))
    if "router" in data:
        cfg = replace(cfg, router=_dataclass_from(RouterConfig, "router", data["router"]))
        if cfg.router.discovery_interval_s <= 0:
            raise RoutingConfigError("router.discovery_interval_s must be > 0")
    if "auto" in data:
        cfg = replace(cfg, auto=_dataclass_from(AutoConfig, "auto", data["auto"]))
    _check_names(cfg)
    return cfg


def _check_names(cfg: RoutingConfig) -> None:
    names = {m.name for m in cfg.models}
    for source, targets in cfg.fallbacks.items():
        for target in (source, *targets):
            if target not in names:
                raise RoutingConfigError(f"fallbacks name an unknown model {target!r} (models: {sorted(names)})")
    if cfg.auto.small or cfg.auto.large:
        for target in (cfg.auto.small, cfg.auto.large):
            if target not in names:
                raise RoutingConfigError(f"auto.small and auto.large must both name models, got {target!r}")
