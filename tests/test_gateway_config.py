"""Configuration (YAML + environment), and the no-torch rule for the gateway package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, GatewayConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "gateway" / "config.example.yaml"


def test_importing_the_gateway_never_imports_torch() -> None:
    code = (
        "import sys, gateway.app, gateway.__main__, gateway.config\n"
        "heavy = ('torch', 'transformers', 'backend.engine.async_engine', 'backend.embed.embeddings')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])


def test_defaults_without_file_or_env() -> None:
    cfg = load_config(None, environ={})
    assert cfg == GatewayConfig()
    assert cfg.model_aliases["gpt-4o-mini"] == "SmolLM2-135M-Instruct"


def test_example_file_loads() -> None:
    cfg = load_config(EXAMPLE, environ={})
    assert cfg.port == 8000 and cfg.engine.block_size == 16


def test_yaml_then_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        "port: 9000\napi_keys: [a-key]\nmodel_aliases: {fast: SmolLM2-135M-Instruct}\n"
        "engine: {max_num_seqs: 8, kv_cache_memory_mb: 128}\n"
    )
    cfg = load_config(path, environ={})
    assert (cfg.port, cfg.api_keys, dict(cfg.model_aliases)) == (
        9000,
        ("a-key",),
        {"fast": "SmolLM2-135M-Instruct"},
    )
    assert (cfg.engine.max_num_seqs, cfg.engine.kv_cache_memory_mb) == (8, 128)
    env = {
        "SMOLGATE_CONFIG": str(path),
        "PORT": "9100",
        "HOST": "0.0.0.0",
        "SMOLGATE_API_KEYS": "k1, k2",
        "SMOLGATE_MODEL_ALIASES": "gpt-4o-mini=SmolLM2-135M-Instruct",
        "SMOLGATE_MAX_BODY_BYTES": "1024",
        "SMOLGATE_ACCESS_LOG": "false",
        "SMOLGATE_MAX_NUM_SEQS": "4",
    }
    cfg = load_config(None, environ=env)
    assert (cfg.host, cfg.port, cfg.api_keys, cfg.max_body_bytes) == ("0.0.0.0", 9100, ("k1", "k2"), 1024)
    assert dict(cfg.model_aliases) == {"gpt-4o-mini": "SmolLM2-135M-Instruct"} and cfg.access_log is False
    assert cfg.engine.max_num_seqs == 4 and cfg.engine.kv_cache_memory_mb == 128


def test_api_keys_stay_out_of_repr() -> None:
    assert "secret-key" not in repr(GatewayConfig(api_keys=("secret-key",)))


@pytest.mark.parametrize(
    "text", ["portt: 1\n", "port: eighty\n", "engine: {block_sise: 4}\n", "api_keys: 5\n", "- a list\n"]
)
def test_bad_files_are_rejected(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path, environ={})


def test_bad_env_is_rejected() -> None:
    with pytest.raises(ConfigError):
        load_config(None, environ={"PORT": "eighty"})
    with pytest.raises(ConfigError):
        load_config(None, environ={"SMOLGATE_MODEL_ALIASES": "no-equals-sign"})
