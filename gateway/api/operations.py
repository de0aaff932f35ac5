"""GET /health, /ready, /metrics, /v1/models and /v1/models/{id}."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response

from gateway.anthropic.models import model_info, model_list, wants_anthropic
from gateway.context import GatewayContext
from gateway.errors import ServiceUnavailable
from gateway.ops.metrics import CONTENT_TYPE
from gateway.ops.record import record_of
from gateway.protocol.jsonio import json_response


class Operations:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def health(self, request: Request) -> Response:
        """Liveness: the process serves HTTP."""
        return json_response({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        """Readiness: the model is loaded and the engine loop runs."""
        if not self.ctx.readiness.ready:
            raise ServiceUnavailable("The model is not loaded yet.")
        return json_response({"status": "ready", "model": self.ctx.engine.model_name})

    async def metrics(self, request: Request) -> Response:
        return Response(self.ctx.metrics.render(), media_type=CONTENT_TYPE)

    def _allowed(self, request: Request) -> Callable[[str], bool]:
        """The models this request's API key may use (every one without a restriction)."""
        policy = record_of(request).policy
        if policy is None or not policy.models:
            return lambda _: True
        return lambda model: self.ctx.guard.allows(policy, model, self.ctx.catalog.canonical)

    async def list_models(self, request: Request) -> Response:
        models = self.ctx.catalog.listing(self._allowed(request))
        if wants_anthropic(request.headers):
            return json_response(model_list(models))
        return json_response({"object": "list", "data": models})

    async def get_model(self, request: Request) -> Response:
        name = request.path_params["model_id"]
        if not self._allowed(request)(self.ctx.catalog.canonical(name)):
            raise self.ctx.guard.not_found(name)
        model = self.ctx.catalog.lookup(name)
        return json_response(model_info(model) if wants_anthropic(request.headers) else model)
