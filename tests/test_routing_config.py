"""gateway/routing/config.py through gateway/config.py: the models / fallbacks / router / auto sections,
API keys with policies, secrets from the environment, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, from_mapping, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "gateway" / "routing.example.yaml"


def test_no_models_section_means_no_routing() -> None:
    cfg = from_mapping({"api_keys": ["k"]})
    assert not cfg.routing.enabled and cfg.accepted_keys() == ("k",)


def test_the_example_file_loads_with_its_secrets() -> None:
    env = {"OPENAI_API_KEY": "sk-upstream", "TEAM_A_KEY": "sk-team-a", "ADMIN_KEY": "sk-admin"}
    cfg = load_config(EXAMPLE, environ=env)
    r = cfg.routing
    assert [m.name for m in r.models] == ["smollm", "gpt-4o-mini"]
    b1, b2 = r.model("smollm").deployments  # type: ignore[union-attr]
    assert b1.kind == "backend" and b1.prefix_affinity and b2.rpm == 0 and b1.rpm == 600
    (openai_dep,) = r.model("gpt-4o-mini").deployments  # type: ignore[union-attr]
    assert openai_dep.api_key == "sk-upstream" and "sk-upstream" not in repr(cfg)
    assert dict(r.fallbacks) == {"smollm": ("gpt-4o-mini",)}
    assert (r.auto.small, r.auto.large, r.auto.enabled) == ("smollm", "gpt-4o-mini", True)
    team, admin = cfg.key_policies
    assert (team.name, team.models, team.rpm, team.key) == ("team-a", ("smollm", "auto"), 120, "sk-team-a")
    assert admin.models == () and "sk-team-a" in cfg.accepted_keys() and "sk-team-a" not in repr(cfg)
    assert not r.needs_engine
    assert load_config(EXAMPLE, environ={**env, "SMOLGATE_ROUTER_REDIS_URL": "redis://x:1/0"}).routing.router.redis_url == "redis://x:1/0"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"models": {"m": {"deployments": [{"kind": "grpc"}]}}}, "kind must be one of"),
        ({"models": {"m": {"deployments": [{"kind": "openai", "base_url": "ftp://x"}]}}}, "base_url"),
        ({"models": {"m": {"deployments": [{"kind": "embedded", "colour": 1}]}}}, "unknown"),
        ({"models": {"m": {"deployments": [{"kind": "embedded", "weight": -1}]}}}, "non-negative"),
        ({"models": {"m": {"deployments": []}}}, "at least one"),
        ({"models": {"auto": {"deployments": [{"kind": "embedded"}]}}}, "reserved"),
        ({"models": {"m": {"deployments": [{"kind": "embedded"}]}}, "fallbacks": {"m": ["x"]}}, "unknown model 'x'"),
        ({"models": {"m": {"deployments": [{"kind": "embedded"}]}}, "auto": {"small": "m"}}, "auto.small"),
        ({"api_keys": [{"key_env": "MISSING"}]}, "MISSING is not set"),
        ({"api_keys": [{"models": ["m"]}]}, "key_env"),
        ({"router": {"num_retries": "3"}}, "router.num_retries"),
        ({"models": {"m": {"deployments": [{"kind": "openai", "base_url": "http://x/v1", "api_key_env": "NOPE"}]}}},
         "NOPE is not set or empty"),
        ({"api_keys": ["sha256:abc"]}, "64 hex digits"),
        ({"api_keys": [{"key": "k1", "priority": "high"}]}, "32-bit integer"),
        ({"api_keys": [{"key": "k1", "name": "a"}, {"key": "k2", "name": "a"}]}, "same name"),
        ({"key_defaults": {"max_tokns": 5}}, "unknown key_defaults"),
        ({"key_defaults": {"max_sequences": 0}}, "max_sequences"),
        ({"admin_keys": [{"key_env": "MISSING_ADMIN"}]}, "MISSING_ADMIN"),
    ],
)
def test_bad_routing_sections_are_rejected(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_mapping(data, {})


def test_key_policies_defaults_admin_keys_and_hashes() -> None:
    digest = "sha256:" + "AB" * 32
    cfg = from_mapping(
        {
            "key_defaults": {"max_tokens": 64, "priority": 5},
            "api_keys": ["a-plain-key-long-enough", digest, {"key_env": "K", "name": "t", "max_sequences": 2}],
            "admin_keys": [{"key_env": "OPS"}],
        },
        {"K": "sk-team", "OPS": "sk-ops"},
    )
    plain, hashed, team = cfg.policies()
    assert (plain.name, plain.max_tokens, plain.priority) == ("…ough", 64, 5)
    assert (hashed.name, hashed.key) == ("key1", digest.lower())
    assert (team.name, team.key, team.max_tokens, team.max_sequences) == ("t", "sk-team", 64, 2)
    assert cfg.admin_keys == ("sk-ops",) and "sk-ops" not in repr(cfg) and "sk-ops" in cfg.secrets()
    env = load_config(None, environ={"SMOLGATE_API_KEYS": "k1", "SMOLGATE_ADMIN_KEYS": f"ops1,{digest}"})
    assert env.admin_keys == ("ops1", digest.lower())
