"""Composition root: `python -m gateway [--config FILE] [--host H] [--port P]`.

The only place that builds the embedded engine and the embedder (both import torch,
lazily, inside functions), hands them to the app, and runs uvicorn.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import uvicorn

from gateway.app import build_context, create_app
from gateway.client import EmbeddingClient, EngineClient
from gateway.config import ConfigError, GatewayConfig, load_config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m gateway", description="OpenAI-compatible LLM gateway")
    parser.add_argument("--config", help="YAML config file (default: $SMOLGATE_CONFIG)")
    parser.add_argument("--host", help="bind address (overrides $HOST and the file)")
    parser.add_argument("--port", type=int, help="port (overrides $PORT and the file)")
    return parser.parse_args(argv)


def build_engine(cfg: GatewayConfig) -> EngineClient:
    from backend.async_engine import AsyncEngine

    engine: EngineClient = AsyncEngine.from_config(cfg.engine)
    return engine


def build_embedder(cfg: GatewayConfig) -> EmbeddingClient | None:
    if not cfg.embeddings:
        return None
    from backend.embeddings import Embedder

    return Embedder(cfg.embedding_model or None)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        sys.exit(f"configuration error: {exc}")
    cfg = dataclasses.replace(cfg, host=args.host or cfg.host, port=args.port or cfg.port)
    app = create_app(build_context(cfg, build_engine(cfg), build_embedder(cfg)))
    uvicorn.run(
        app,
        host=cfg.host,
        port=cfg.port,
        access_log=False,
        log_level=cfg.log_level,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
