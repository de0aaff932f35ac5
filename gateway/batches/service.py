"""Wiring: build_batches(ctx, router, handlers) -> the routes and the start/stop of the runner, the expiry
sweep and the directory lock, for gateway/app.py."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from starlette.routing import Route

from gateway.batches.dispatch import Handler
from gateway.batches.endpoints import BatchEndpoints
from gateway.batches.files import FileStore
from gateway.batches.lock import DirLock
from gateway.batches.runner import BatchRunner
from gateway.batches.storage import tenant_of_key
from gateway.batches.store import BatchStore
from gateway.batches.validate import ENDPOINTS
from gateway.context import GatewayContext
from gateway.errors import ModelNotFound
from gateway.keys.config import KeyPolicy
from gateway.models import ModelKind
from gateway.ops.access_log import Logger
from gateway.ops.record import RequestRecord

STANDBY_POLL_S = 1.0  # how often a standby gateway tries to take the directory lock over


@dataclass
class Batches:
    runner: BatchRunner
    endpoints: BatchEndpoints
    files: FileStore
    lock: DirLock
    sweep_s: float
    logger: Logger
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    def routes(self) -> list[Route]:
        return self.endpoints.routes()

    async def start(self) -> None:
        if not self.lock.acquire():
            self.logger.warning("batches_standby", dir=str(self.lock.path.parent), holder=self.lock.holder())
            self.endpoints.standby_reason = self._standby_reason
        else:
            await self._activate()
        self._task = asyncio.create_task(self._serve(), name="batches")

    def _standby_reason(self) -> str:
        return (
            f"Another gateway ({self.lock.holder() or 'unknown'}) runs the batches in {self.lock.path.parent}; this one "
            "takes over when it stops. Give each gateway its own batches.dir, or send batch requests to that one."
        )

    async def _activate(self) -> None:
        await self.runner.start()
        self.endpoints.standby_reason = None

    async def _serve(self) -> None:
        """Stand by until the lock is ours, then delete expired files now and every `sweep_s`."""
        while not self.lock.held:
            await asyncio.sleep(STANDBY_POLL_S)
            if self.lock.acquire():
                self.logger.info("batches_taken_over", dir=str(self.lock.path.parent))
                await self._activate()
        while True:
            try:
                removed = await asyncio.to_thread(self.files.sweep)
            except OSError as exc:  # a disk error must not end the sweeping for good
                self.logger.warning("files_sweep_failed", error=str(exc))
            else:
                if removed:
                    self.logger.info("files_expired", removed=removed)
            await asyncio.sleep(self.sweep_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lock.held:
            await self.runner.stop()
            self.lock.release()


def build_batches(ctx: GatewayContext, router: Any, routes: list[Route]) -> Batches:
    """`routes`: the gateway's routes; batch lines go to the handlers they serve ENDPOINTS with."""
    cfg = ctx.config.batches
    root = cfg.path
    root.mkdir(parents=True, exist_ok=True)
    handlers: dict[str, Handler] = {r.path: r.endpoint for r in routes if r.path in ENDPOINTS and "POST" in (r.methods or ())}
    files, store = FileStore(root), BatchStore(root)
    policies = {tenant_of_key(p.key): p for p in ctx.guard.policies}  # the guard's own: its rate limits
    guard = ctx.guard

    def model_error(endpoint: str, model: str, policy: KeyPolicy | None) -> str | None:
        """Why the batch's key may not send `model` to `endpoint` (None: it may), as the live request path decides."""
        policy = policy if policy is not None else guard.anonymous
        unknown = f"The model `{model}` does not exist or you do not have access to it."
        if router is None or endpoint == "/v1/embeddings":
            kind: ModelKind = "embedding" if endpoint == "/v1/embeddings" else "chat"
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

    async def spend(rec: RequestRecord) -> None:
        """A finished line: its ledger row (and cost), then its tokens and cost against its key's limits."""
        ctx.spend.charge(rec)
        await guard.spend(rec)

    runner = BatchRunner(
        cfg, files, store, handlers, live_in_flight=lambda: ctx.stats.in_flight, policy_of=policies.get,
            model_error=model_error, takes_priority=takes_priority,
        registry=ctx.metrics.registry, logger=ctx.logger, new_id=ctx.ids.new, tokens_left=guard.tokens_left, spend=spend,
    )  # fmt: skip
    endpoints = BatchEndpoints(cfg, files, store, runner, keyed=bool(policies), body_limit=ctx.config.max_body_bytes)
    return Batches(runner, endpoints, files, DirLock(root), cfg.sweep_s, ctx.logger)
