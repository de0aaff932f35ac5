"""create_app: wire routes, middleware and the engine's lifespan into a Starlette app.

Importing this module does nothing but define functions (and never imports torch);
`gateway/__main__.py` builds the real engine and passes it in.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TextIO

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.aliases import retarget_defaults
from gateway.anthropic.endpoint import Messages
from gateway.anthropic.errors import error_response as anthropic_error_response
from gateway.anthropic.errors import is_anthropic_path
from gateway.api.chat import ChatCompletions
from gateway.api.completions import Completions
from gateway.api.dashboard import Dashboard
from gateway.api.embeddings import Embeddings
from gateway.api.operations import Operations
from gateway.api.tokenize import Tokenizer
from gateway.batches.service import build_batches
from gateway.cache.metrics import CacheMetrics
from gateway.cache.service import ResponseCache, build_cache
from gateway.cache.stores import CacheStore
from gateway.client import EmbeddingClient, EngineClient, NoEngine
from gateway.config import DEFAULT_MODELS, GatewayConfig
from gateway.context import GatewayContext, OwnModel
from gateway.errors import GatewayError, error_response, to_gateway_error
from gateway.ids import IdGenerator
from gateway.keys.guard import Endpoint
from gateway.middleware import GatewayMiddleware
from gateway.models import ModelCatalog, ModelKind, ServedModel
from gateway.openai_responses.api import ResponsesAPI
from gateway.ops.access_log import make_logger
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.record import record_of
from gateway.protocol.jsonio import read_json
from gateway.routing.router import Endpoint as RoutedEndpoint
from gateway.routing.router import LocalHandler, Router
from gateway.spend.usage_api import UsageAPI

if TYPE_CHECKING:  # the SDK is imported only when traces are exported
    from gateway.tracing.otel import Tracing

Handler = Callable[[Request, dict[str, Any]], Awaitable[Response]]


def build_context(
    config: GatewayConfig,
    engine: EngineClient | None,
    embedder: EmbeddingClient | None = None,
    log_sink: TextIO | None = None,
    *,
    cache_store: CacheStore | None = None,
    cache_embedder: EmbeddingClient | None = None,
    engines: Mapping[str, EngineClient] | None = None,
) -> GatewayContext:
    """`cache_store` replaces the configured response-cache backend (tests inject faults with it). `cache_embedder`:
    what the semantic cache embeds with (`cache.embedding_dtype`: gateway/__main__.py builds it), default `embedder`.

    `engine` None: a gateway that only routes to upstreams (config.routing with no embedded deployment).
    `engines`: the `models:` list's engines by model id (config.routing.own_engines; `engine` is the first of them)."""
    created = int(time.time())
    routed = [m.name for m in config.routing.models] + (["auto"] if config.routing.auto.enabled else [])
    models = [ServedModel(name, "chat", created) for name in routed] if routed else []
    if engine is not None and not routed:
        models.append(ServedModel(engine.model_name, "chat", created))
    if embedder is not None:
        models.append(ServedModel(embedder.model_name, "embedding", created))
    engines = engines or {}
    stats = engine.stats if engine is not None else None
    metrics = GatewayMetrics({m: e.stats for m, e in engines.items()} if engines else stats)
    tracing = build_tracing(config)
    if tracing is not None:  # their generations get engine spans (queue, prefill, decode)
        engine, engines = _traced_engines(tracing, engine, engines)
    engine = engine if engine is not None else NoEngine()
    logger = make_logger(log_sink or sys.stderr, config.log_level, config.secrets())
    ids = IdGenerator()
    cache_embedder = cache_embedder or embedder
    cache_metrics = CacheMetrics(metrics.registry)

    def cache_of(model_id: str, served_by: EngineClient, store: CacheStore | None) -> ResponseCache:
        route = config.routing.model(model_id) if engines else None
        return build_cache(
            config, model_id, cache_embedder, cache_metrics, logger=logger, ids=ids, store=store,
            resolved=getattr(served_by, "output_identity", None),  # the embedded engine's resolved `auto` settings
            engine=None if isinstance(served_by, NoEngine) else served_by,
            engine_config=route.engine.config if route is not None and route.engine is not None else None,
        )  # fmt: skip

    cache = cache_of(engine.model_name, engine, cache_store)
    # one store for every model, each model its own scope in it (its fingerprint keys its entries)
    shared = cache.store.inner if cache.store is not None else None
    own = {m: OwnModel(e, cache if e is engine else cache_of(m, e, shared)) for m, e in engines.items()}
    return GatewayContext(
        config=config,
        engine=engine,
        embedder=embedder,
        catalog=ModelCatalog(models, retarget_defaults(config.model_aliases, DEFAULT_MODELS, {m.id: m.kind for m in models})),
        metrics=metrics,
        logger=logger,
        cache=cache,
        ids=ids,
        own_models=MappingProxyType(own),
        tracing=tracing,
    )


def _traced_engines(
    tracing: Tracing, engine: EngineClient | None, engines: Mapping[str, EngineClient]
) -> tuple[EngineClient | None, dict[str, EngineClient]]:
    """Every engine wrapped once (gateway/tracing/engine.py), so `engines`' entry that is `engine` stays `engine`."""
    from gateway.tracing.engine import TracedEngine

    wrapped: dict[int, EngineClient] = {}

    def wrap(e: EngineClient) -> EngineClient:
        return wrapped.setdefault(id(e), TracedEngine(e, tracing))

    return (wrap(engine) if engine is not None else None), {m: wrap(e) for m, e in engines.items()}


def build_tracing(config: GatewayConfig) -> Tracing | None:
    """The gateway's Tracing (gateway/tracing/otel.py) when spans are exported; None (and no OpenTelemetry SDK
    loaded) when `traces.endpoint` is unset."""
    if not config.traces.enabled:
        return None
    from gateway.tracing.otel import Tracing

    return Tracing(config.traces, config.secrets())


def build_router(ctx: GatewayContext) -> Router | None:
    """The router over config.routing.models; None without a `models` section (embedded engine only)."""
    if not ctx.config.routing.enabled:
        return None
    local: dict[RoutedEndpoint, LocalHandler] = {"chat": ChatCompletions(ctx).handle, "completions": Completions(ctx).handle}
    own: dict[str, dict[RoutedEndpoint, LocalHandler]] = {
        m: {"chat": ChatCompletions(c).handle, "completions": Completions(c).handle}
        for m, c in ((m, ctx.of_model(m)) for m in ctx.own_models)
    }
    return Router(
        ctx.config, local, ctx.metrics.registry, ctx.logger, embedder=ctx.embedder, guard=ctx.guard, cache=ctx.cache, own=own
    )


def guarded(ctx: GatewayContext, endpoint: Endpoint, handler: Handler) -> Handler:
    """`handler` behind the API key's policy (gateway/keys/guard.py): its models, caps, priority and rate limits. The
    router applies the same checks itself (after `auto` and before fallbacks)."""
    kind: ModelKind = "embedding" if endpoint == "embeddings" else "chat"

    async def handle(request: Request, raw: dict[str, Any]) -> Response:
        rec = record_of(request)
        policy = rec.policy if rec.policy is not None else ctx.guard.anonymous
        name = raw.get("model")
        if isinstance(name, str) and name and policy.models and (kind == "chat" or ctx.embedder is not None):
            model = ctx.catalog.resolve(name, kind)
            if not ctx.guard.allows(policy, model.id, ctx.catalog.canonical):
                raise ctx.guard.not_found(name)
        raw = ctx.guard.check_body(policy, endpoint, raw)
        await ctx.guard.admit(policy, rec, endpoint, raw, model=_served(ctx, name, kind))
        return await handler(request, raw)

    return handle


def _served(ctx: GatewayContext, name: object, kind: ModelKind) -> str:
    """The served model a request names (its price); the name itself when unknown (the handler answers 404)."""
    try:
        return ctx.catalog.resolve(name, kind).id if isinstance(name, str) and name else ""
    except GatewayError:
        return name if isinstance(name, str) else ""


def checked(ctx: GatewayContext, endpoint: Endpoint, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """`guarded(handler)` as a route: reads the JSON body first."""
    inner = guarded(ctx, endpoint, handler)

    async def handle(request: Request) -> Response:
        return await inner(request, await read_json(request, ctx.config.max_body_bytes))

    return handle


def chat_handler(ctx: GatewayContext, router: Router | None = None) -> Handler:
    """What serves a chat body that another endpoint (/v1/responses, /v1/messages) translated its request into:
    the chat handler behind the key's policy, or the router."""
    chat: Handler = guarded(ctx, "chat", ChatCompletions(ctx).handle)
    if router is not None:

        async def chat(request: Request, raw: dict[str, Any]) -> Response:
            return await router.handle("chat", request, raw)

    return chat


def responses_api(ctx: GatewayContext, router: Router | None = None) -> ResponsesAPI:
    """/v1/responses, translated into chat-completions requests run by the chat handler (or the router)."""
    return ResponsesAPI(ctx, chat_handler(ctx, router))


def routes(ctx: GatewayContext, router: Router | None = None, responses: ResponsesAPI | None = None) -> list[Route]:
    ops = Operations(ctx)
    chat = checked(ctx, "chat", ChatCompletions(ctx).handle)
    completions = checked(ctx, "completions", Completions(ctx).handle)
    if router is not None:  # Starlette needs real coroutine functions (a lambda would run in a thread)

        async def chat(request: Request) -> Response:
            return await router.handle("chat", request)

        async def completions(request: Request) -> Response:
            return await router.handle("completions", request)

    dashboard = Dashboard(ctx)
    messages = Messages(ctx, chat_handler(ctx, router), router)  # Anthropic's Messages API, served by the chat handler
    usage = UsageAPI(ctx.spend.ledger, ctx.config.spend.currency)  # OpenAI's Usage and Costs APIs (an admin key)
    tokens = Tokenizer(ctx)
    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/messages", messages.create, methods=["POST"]),
        Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
        *(responses.routes() if responses is not None else ()),
        Route("/v1/embeddings", checked(ctx, "embeddings", Embeddings(ctx).handle), methods=["POST"]),
        Route("/v1/organization/usage/completions", usage.completions, methods=["GET"]),
        Route("/v1/organization/usage/embeddings", usage.embeddings, methods=["GET"]),
        Route("/v1/organization/costs", usage.costs, methods=["GET"]),
        Route("/tokenize", tokens.tokenize, methods=["POST"]),
        Route("/detokenize", tokens.detokenize, methods=["POST"]),
        Route("/v1/models", ops.list_models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", ops.get_model, methods=["GET"]),
        Route("/health", ops.health, methods=["GET"]),
        Route("/ready", ops.ready, methods=["GET"]),
        Route("/metrics", ops.metrics, methods=["GET"]),
        Route("/v1/stats", dashboard.stats, methods=["GET"]),
        Route("/dashboard", dashboard.page, methods=["GET"]),
        Route("/dashboard/dashboard.js", dashboard.script, methods=["GET"]),
    ]


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Router 404/405s, rendered as OpenAI errors like everything else (Anthropic's shape under /v1/messages)."""
    if is_anthropic_path(request.url.path):
        return anthropic_error_response(to_gateway_error(exc), record_of(request).request_id)
    return error_response(to_gateway_error(exc))


def create_app(ctx: GatewayContext, *, manage_engine: bool = True) -> Starlette:
    """The ASGI app. With manage_engine, the lifespan starts and shuts down the engine."""
    router = build_router(ctx)
    responses = responses_api(ctx, router)
    route_list = routes(ctx, router, responses)
    batches = build_batches(ctx, router, route_list) if ctx.config.batches.enabled else None  # /v1/files, /v1/batches

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if manage_engine:
            for engine in ctx.engines():
                await engine.start()
        if router is not None:
            await router.start()  # the replicas found by DNS, before the gateway says it is ready
        if batches is not None:
            await batches.start()
        # What startup loaded (the engine, the embedder, the app) lives as long as the process: keep it out of the
        # cyclic collector's full passes, which otherwise walk it all (0.2-0.4 s with the engine) mid-stream.
        gc.collect()
        gc.freeze()
        ctx.readiness.ready = True
        ctx.logger.info("ready", model=ctx.engine.model_name, host=ctx.config.host, port=ctx.config.port)
        try:
            yield
        finally:
            ctx.readiness.ready = False
            if batches is not None:
                await batches.stop()
            await ctx.cache.close()
            await ctx.guard.close()
            await asyncio.to_thread(ctx.spend.close)  # joins the ledger's writer: not on the event loop
            await responses.close()
            if router is not None:
                await router.close()
            if manage_engine:
                for engine in ctx.engines():
                    await engine.shutdown()
            if ctx.tracing is not None:  # what is still queued is exported
                await asyncio.to_thread(ctx.tracing.shutdown)

    middleware = [Middleware(GatewayMiddleware, ctx=ctx)]
    if ctx.tracing is not None:  # outermost: rejected requests are traced too
        from gateway.tracing.middleware import TracingMiddleware

        middleware.insert(0, Middleware(TracingMiddleware, tracing=ctx.tracing))
    app = Starlette(
        routes=route_list + (batches.routes() if batches is not None else []),
        middleware=middleware,
        exception_handlers={HTTPException: _http_exception},
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    app.state.router = router
    return app
