"""The gateway's one ASGI middleware: request id, API-key check, body limit, error translation,
and — when the response is over — the access-log line and the metrics."""

from __future__ import annotations

import hmac
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.access_log import log_request
from gateway.context import GatewayContext
from gateway.errors import AuthenticationFailed, PayloadTooLarge, error_response, to_gateway_error
from gateway.ids import IdGenerator
from gateway.record import SCOPE_KEY, RequestRecord

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_PROTECTED_PREFIX = "/v1/"


def _headers(scope: Scope) -> dict[bytes, bytes]:
    wanted = {b"authorization", b"x-request-id", b"content-length"}
    return {k: v for k, v in scope["headers"] if k in wanted}


def _request_id(headers: dict[bytes, bytes], ids: IdGenerator) -> str:
    given = headers.get(b"x-request-id", b"").decode("latin-1")
    return given if _REQUEST_ID.fullmatch(given) else ids.new()


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, ctx: GatewayContext) -> None:
        self.app = app
        self.ctx = ctx
        self._keys = tuple(k.encode() for k in ctx.config.accepted_keys())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        rec = RequestRecord(_request_id(headers, self.ctx.ids), scope["method"], scope["path"], time.perf_counter())
        scope[SCOPE_KEY] = rec
        started = False
        id_header = (b"x-request-id", rec.request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                rec.status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), id_header]}
            await send(message)

        try:
            self._guard(scope["path"], headers)
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            err = to_gateway_error(exc, retry_after_s=self.ctx.config.retry_after_s)
            self.ctx.report_error(rec, exc, err)
            if not started:
                await error_response(err)(scope, receive, send_with_id)
        finally:
            self._done(scope, rec)

    def _guard(self, path: str, headers: dict[bytes, bytes]) -> None:
        if self._keys and path.startswith(_PROTECTED_PREFIX):
            self._check_key(headers.get(b"authorization"))
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.ctx.config.max_body_bytes:
            raise PayloadTooLarge(f"Request body too large: the limit is {self.ctx.config.max_body_bytes} bytes.")

    def _check_key(self, authorization: bytes | None) -> None:
        if not authorization:
            raise AuthenticationFailed("You didn't provide an API key. Send it in the Authorization header: 'Bearer YOUR_KEY'.")
        scheme, _, key = authorization.partition(b" ")
        ok = scheme.lower() == b"bearer" and any(hmac.compare_digest(key.strip(), k) for k in self._keys)
        if not ok:
            raise AuthenticationFailed("Incorrect API key provided.")

    def _done(self, scope: Scope, rec: RequestRecord) -> None:
        route = scope.get("route")
        if route is not None:
            rec.route = getattr(route, "path", rec.route)
        rec.finish()
        self.ctx.metrics.observe(rec)
        if self.ctx.config.access_log:
            log_request(self.ctx.logger, rec)
