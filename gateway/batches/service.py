"""Wiring: build_batches(ctx, router, handlers) -> the routes and the runner's start/stop, for gateway/app.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.routing import Route

from gateway.batches.dispatch import Handler
from gateway.batches.endpoints import BatchEndpoints
from gateway.batches.files import FileStore
from gateway.batches.runner import BatchRunner
from gateway.batches.storage import tenant_of_key
from gateway.batches.store import BatchStore
from gateway.batches.validate import ENDPOINTS
from gateway.context import GatewayContext
from gateway.errors import ModelNotFound
from gateway.routing.config import KeyPolicy


@dataclass
class Batches:
    runner: BatchRunner
    endpoints: BatchEndpoints

    def routes(self) -> list[Route]:
        return self.endpoints.routes()

    async def start(self) -> None:
        await self.runner.start()

    async def stop(self) -> None:
        await self.runner.stop()


def build_batches(ctx: GatewayContext, router: Any, routes: list[Route]) -> Batches:
    """`routes`: the gateway's routes; batch lines go to the handlers they serve ENDPOINTS with."""
    cfg = ctx.config.batches
    root = cfg.path
    root.mkdir(parents=True, exist_ok=True)
    handlers: dict[str, Handler] = {r.path: r.endpoint for r in routes if r.path in ENDPOINTS and "POST" in (r.methods or ())}
    files, store = FileStore(root), BatchStore(root)
    policies = {tenant_of_key(p.key): p for p in ctx.config.policies()}
    guard = ctx.guard

    def model_error(endpoint: str, model: str, policy: KeyPolicy | None) -> str | None:
        """Why the batch's key may not send `model` to `endpoint` (None: it may), as the live request path decides."""
        policy = policy if policy is not None else guard.anonymous
        unknown = f"The model `{model}` does not exist or you do not have access to it."
        if router is None or endpoint == "/v1/embeddings":
            kind = "embedding" if endpoint == "/v1/embeddings" else "chat"
            try:
                served = ctx.catalog.resolve(model, kind).id
            except ModelNotFound as exc:
                return exc.message
            if endpoint == "/v1/embeddings" and ctx.embedder is None:
                return "Embeddings are not enabled on this server."
            return None if guard.allows(policy, served, ctx.catalog.canonical) else unknown
        if model == "auto" and router.auto_enabled:
            return None if guard.allows(policy, "auto") else unknown
        name = router.aliases.get(model, model)
        known = name in router.balancers
        return None if known and guard.allows(policy, name, lambda n: router.aliases.get(n, n)) else unknown

    def takes_priority(endpoint: str, model: str) -> bool:
        """Whether the line's target reads the `priority` field: the embedded engine and smolgate backends
        do, an OpenAI-compatible upstream may refuse an unknown field."""
        if endpoint == "/v1/embeddings":
            return False
        if router is None:
            return True
        balancer = router.balancers.get(router.aliases.get(model, model))
        return balancer is not None and all(s.cfg.kind in ("embedded", "backend") for s in balancer.states)

    runner = BatchRunner(
        cfg, files, store, handlers, lambda: ctx.stats.in_flight, policies.get, model_error, takes_priority,
        ctx.metrics.registry, ctx.logger, ctx.ids.new,
    )  # fmt: skip
    endpoints = BatchEndpoints(cfg, files, store, runner, bool(policies), ctx.config.max_body_bytes)
    return Batches(runner, endpoints)
