"""Composition root: `python -m gateway [--config FILE] [--host H] [--port P] [--embedded-only] [--parallel KIND]`.

The only place that builds the embedded engine and the embedders (they import torch,
lazily, inside functions), hands them to the app, and runs uvicorn. A gateway whose
`models` section has no deployment of kind embedded never loads the engine; a `models:` list loads one engine
per entry.

    python -m gateway --embedded-only                              # a backend replica: the engine, no routing
    torchrun --nproc-per-node 2 -m gateway --parallel tensor       # one engine over 2 processes (or pipeline)

The command line and the configuration file are read by backend/config.py, below both layers.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import uvicorn

from backend.config import ConfigError, EngineConfig, parse_args
from gateway.app import build_context, create_app
from gateway.client import EmbeddingClient, EngineClient
from gateway.config import GatewayConfig, load_config
from gateway.ops.access_log import route_stdlib_logging
from gateway.routing.config import RoutingConfig


def build_engine(cfg: GatewayConfig) -> EngineClient | None:
    """The `engine:` section's engine; None for a pure router, or when the `models:` list names the engines."""
    if (cfg.routing.enabled and not cfg.routing.needs_engine) or cfg.routing.own_engines:
        return None  # a pure router (no torch in this process), or the list's engines (build_engines)
    return _load(cfg.engine)


def build_engines(cfg: GatewayConfig) -> dict[str, EngineClient]:
    """The `models:` list's engines by model id, in the file's order: each its own AsyncEngine (model, quantization,
    chat template, KV budget). Every model's file is checked before the first one loads (a bad last entry fails fast)."""
    own = [(m.name, m.engine.config) for m in cfg.routing.own_engines if m.engine is not None]
    for name, engine_cfg in own:
        _preflight(engine_cfg, name)
    return {name: _load(engine_cfg, name) for name, engine_cfg in own}


def _preflight(engine_cfg: EngineConfig, model_id: str = "") -> None:
    """One line, what was found and what is supported, no traceback; before torch is imported."""
    from backend.errors import ModelLoadError
    from backend.model.arch import preflight

    try:
        preflight(engine_cfg.resolved_model())
    except ModelLoadError as exc:
        sys.exit(f"model error: {model_id + ': ' if model_id else ''}{exc}")


def _load(engine_cfg: EngineConfig, model_id: str = "") -> EngineClient:
    from backend.errors import ModelLoadError

    _preflight(engine_cfg, model_id)
    try:
        from backend.engine.async_engine import AsyncEngine

        engine: EngineClient = AsyncEngine.from_config(engine_cfg)
    except ModelLoadError as exc:
        sys.exit(f"model error: {model_id + ': ' if model_id else ''}{exc}")
    return engine


def build_embedders(cfg: GatewayConfig, engine: EngineClient | None) -> tuple[EmbeddingClient | None, EmbeddingClient | None]:
    """/v1/embeddings' embedder (`embedding_dtype`) and the semantic cache's (`cache.embedding_dtype`, with the learned
    matcher's fine-tuned top layers in `learned` and `union` modes; the same object when that changes nothing, or
    when the cache does no semantic matching). The cache's shares the first one's
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
    try:
        top = None
        if cfg.cache.semantic_match in ("learned", "union"):  # the matcher's heads read its fine-tuned encoder's states
            from gateway.cache.matcher import MatcherModel

            top = MatcherModel.load().encoder
        return embedder, for_cache(embedder, cfg.cache.embedding_dtype, top)
    except ValueError as exc:  # a missing or foreign encoder file, a dtype this machine cannot run
        sys.exit(f"configuration error: the semantic cache's embedder: {exc}")


def main(argv: list[str] | None = None, prog: str = "python -m gateway") -> None:
    args = parse_args(argv, prog)
    if args.parallel:  # under torchrun: rank 0 serves, the other ranks run their part of the model
        from backend.parallel.driver import launch

        launch(args.parallel, lambda: serve(args), args.config)
    else:
        serve(args)


def serve(args: argparse.Namespace) -> None:
    """`--embedded-only`: ignore any routing sections and serve the embedded engine (a backend replica)."""
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        sys.exit(f"configuration error: {exc}")
    cfg = dataclasses.replace(cfg, host=args.host or cfg.host, port=args.port or cfg.port)
    # the engine's records (backend/, kernels/: the standard library) and uvicorn's, in the access log's format
    route_stdlib_logging(sys.stderr, cfg.log_level, cfg.secrets())
    if args.parallel and cfg.routing.own_engines:  # the other ranks load the `engine:` section's model
        sys.exit("configuration error: --parallel serves one model (the engine: section), not a models: list")
    if args.embedded_only:  # the `models:` list's models stay: they are this process's engines
        cfg = dataclasses.replace(cfg, routing=RoutingConfig(models=cfg.routing.own_engines))
    engines = build_engines(cfg)
    engine = next(iter(engines.values())) if engines else build_engine(cfg)
    embedder, cache_embedder = build_embedders(cfg, engine)
    app = create_app(build_context(cfg, engine, embedder, cache_embedder=cache_embedder, engines=engines))
    uvicorn.run(
        app,
        host=cfg.host,
        port=cfg.port,
        access_log=False,
        log_config=None,  # uvicorn's loggers propagate to the root logger's handler (route_stdlib_logging)
        log_level=cfg.log_level,
        # SIGTERM: uvicorn stops accepting, then waits this long for in-flight requests (streams included:
        # gateway/protocol/sse.py) before it cancels them and the lifespan stops the engine.
        # uvicorn annotates both as int, but hands them to asyncio as seconds, where a float is what they are
        timeout_graceful_shutdown=cfg.drain_timeout_s,  # type: ignore[arg-type]
        timeout_keep_alive=cfg.keep_alive_s,  # type: ignore[arg-type]
    )


if __name__ == "__main__":
    main()
