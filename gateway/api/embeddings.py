"""POST /v1/embeddings: sentence embeddings (float or base64), off the event loop."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.context import GatewayContext
from gateway.errors import InvalidRequest, ModelNotFound
from gateway.ops.record import record_of
from gateway.protocol.generation import unless_disconnected
from gateway.protocol.jsonio import json_response, read_json
from gateway.protocol.requests import parse_embedding
from gateway.protocol.responses import embedding_list

MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


class Embeddings:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def handle(self, request: Request, raw: dict[str, Any] | None = None) -> Response:
        """`raw`: the body, when it has been read already (the API key's checks read it: gateway/app.py)."""
        rec = record_of(request)
        raw = raw if raw is not None else await read_json(request, self.ctx.config.max_body_bytes)
        req = parse_embedding(raw, strict_params=self.ctx.config.strict_params)
        embedder = self.ctx.embedder
        if embedder is None:
            raise ModelNotFound("Embeddings are not enabled on this server.", param="model")
        model = self.ctx.catalog.resolve(req.model, "embedding")
        rec.model = model.id
        rec.user = req.user
        if len(req.inputs) > MAX_INPUTS:
            raise InvalidRequest(f"'input' may hold at most {MAX_INPUTS} items.", param="input")
        if req.dimensions is not None and req.dimensions != embedder.dimensions:
            raise InvalidRequest(
                f"'dimensions' must be {embedder.dimensions} for {model.id}: it cannot be shortened.",
                param="dimensions",
            )
        vectors, tokens = await unless_disconnected(request.receive, embedder.embed(req.inputs))
        rec.prompt_tokens = tokens
        return json_response(embedding_list(model.id, vectors, tokens, req.encoding_format))
