"""Composition root: `python -m gateway [--config FILE] [--host H] [--port P]`.

The only place that builds the embedded engine and the embedders (they import torch,
lazily, inside functions), hands them to the app, and runs uvicorn. A gateway whose
`models` section has no deployment of kind embedded never loads the engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import uvicorn

from gateway.app import build_context, create_app
from gateway.client import EmbeddingClient, EngineClient
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.routing.config import RoutingConfig


def parse_args(argv: list[str] | None, prog: str = "python -m gateway") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description="OpenAI-compatible LLM gateway")
    parser.add_argument("--config", help="YAML config file (default: $SMOLGATE_CONFIG)")
    parser.add_argument("--host", help="bind address (overrides $HOST and the file)")
    parser.add_argument("--port", type=int, help="port (overrides $PORT and the file)")
    return parser.parse_args(argv)


def build_engine(cfg: GatewayConfig) -> EngineClient | None:
    if cfg.routing.enabled and not cfg.routing.needs_engine:
        return None  # a pure router: no torch in this process
    from backend.engine.async_engine import AsyncEngine

    engine: EngineClient = AsyncEngine.from_config(cfg.engine)
    return engine


def build_embedders(cfg: GatewayConfig, engine: EngineClient | None) -> tuple[EmbeddingClient | None, EmbeddingClient | None]:
    """/v1/embeddings' embedder (`embedding_dtype`) and the semantic cache's (`cache.embedding_dtype`; the same object
    when that changes nothing, or when the cache does no semantic matching). The cache's shares the first one's
    tokenizer, thread and embedding tables. With the embedded engine, both run their torch work on the engine's loop
    thread (one torch thread per process: backend/engine/async_engine.py)."""
    if not cfg.embeddings:
        return None, None
    from backend.embed.embeddings import Embedder, for_cache
    from backend.engine.async_engine import AsyncEngine

    executor = engine if isinstance(engine, AsyncEngine) else None
    embedder = Embedder(cfg.embedding_model or None, dtype=cfg.embedding_dtype, executor=executor)
    if not (cfg.cache.enabled and cfg.cache.semantic):
        return embedder, embedder
    return embedder, for_cache(embedder, cfg.cache.embedding_dtype)


def main(argv: list[str] | None = None, *, embedded_only: bool = False, prog: str = "python -m gateway") -> None:
    """`embedded_only`: ignore any routing sections and serve the embedded engine (the backend service)."""
    args = parse_args(argv, prog)
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        sys.exit(f"configuration error: {exc}")
    cfg = dataclasses.replace(cfg, host=args.host or cfg.host, port=args.port or cfg.port)
    if embedded_only:
        cfg = dataclasses.replace(cfg, routing=RoutingConfig())
    engine = build_engine(cfg)
    embedder, cache_embedder = build_embedders(cfg, engine)
    app = create_app(build_context(cfg, engine, embedder, cache_embedder=cache_embedder))
    uvicorn.run(
        app,
        host=cfg.host,
        port=cfg.port,
        access_log=False,
        log_level=cfg.log_level,
        # SIGTERM: uvicorn stops accepting, then waits this long for in-flight requests (streams included:
        # gateway/protocol/sse.py) before it cancels them and the lifespan stops the engine.
        timeout_graceful_shutdown=cfg.drain_timeout_s,
        timeout_keep_alive=cfg.keep_alive_s,
    )


if __name__ == "__main__":
    main()
