"""GET /dashboard (a static page and its script, shipped in the package) and GET /v1/stats (its data).

The page itself holds no data and is served without a key; the figures come from /v1/stats, which needs an
admin key (`admin_keys`) whenever keys are configured (gateway/middleware.py; every tenant's traffic is in it).
The page asks for that key and sends it as a Bearer header.
"""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response

from gateway.context import GatewayContext
from gateway.protocol.jsonio import json_response

# The page loads only its own script; `data:` covers the empty favicon (no /favicon.ico request).
_HEADERS = {
    "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:",
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
}


def _asset(name: str) -> str:  # the page ships with ops/ (its package data), served from here
    return files("gateway.ops").joinpath("static", name).read_text(encoding="utf-8")


class Dashboard:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx
        auth = "required" if ctx.guard.ops_protected else "none"
        self._page = _asset("dashboard.html").replace("{{AUTH}}", auth).encode()
        self._script = _asset("dashboard.js").encode()

    async def page(self, request: Request) -> Response:
        return Response(self._page, media_type="text/html; charset=utf-8", headers=_HEADERS)

    async def script(self, request: Request) -> Response:
        return Response(self._script, media_type="text/javascript; charset=utf-8", headers=_HEADERS)

    async def stats(self, request: Request) -> Response:
        try:
            engine = self.ctx.engine.stats()
        except Exception:  # a dead engine still leaves the gateway's own figures worth showing
            engine = None
        return json_response(self.ctx.stats.snapshot(engine, self.ctx.metrics.registry))
