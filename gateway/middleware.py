"""The gateway's one ASGI middleware: request id, API-key check (gateway/keys/guard.py; an admin key for /metrics and
/v1/stats), body limit, admission limit, body-read
deadline, error translation, and — when the response is over — the access-log line, metrics and stats."""

from __future__ import annotations

import asyncio
import re
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.anthropic.errors import error_response as anthropic_error_response
from gateway.anthropic.errors import is_anthropic_path
from gateway.context import GatewayContext
from gateway.errors import PayloadTooLarge, RequestTimeout, ServerBusy, error_response, to_gateway_error
from gateway.ids import IdGenerator
from gateway.ops.access_log import log_request
from gateway.ops.record import SCOPE_KEY, RequestRecord

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_PROTECTED_PREFIX = "/v1/"
_STATS_PATH = "/v1/stats"  # the dashboard's polling: not counted in the traffic it shows
_OPS_PATHS = frozenset({"/metrics", _STATS_PATH})  # every tenant's traffic: an admin key when keys are configured
_FILES_PATH = "/v1/files"  # uploads (gateway/batches/) have their own size limit
_ADMIN_PREFIX = "/v1/organization/"  # the Usage and Costs APIs (gateway/spend/usage_api.py): an admin key
_KEYED_PATHS = frozenset({"/tokenize", "/detokenize"})  # vLLM's token utilities: a client key, like /v1/


def _headers(scope: Scope) -> dict[bytes, bytes]:
    wanted = {b"authorization", b"x-request-id", b"content-length"}
    return {k: v for k, v in scope["headers"] if k in wanted}


def _with_api_key(scope: Scope) -> Scope:
    """Anthropic clients send the key as `x-api-key`: without an Authorization header it stands for
    `Authorization: Bearer KEY`, so every key check, limit, priority and cache namespace sees one key.

    The scope is changed in place: the tracing middleware outside this one reads the RequestRecord put into it."""
    headers = scope["headers"]
    names = {k for k, _ in headers}
    if b"authorization" in names or b"x-api-key" not in names:
        return scope
    key = next(v for k, v in headers if k == b"x-api-key")
    scope["headers"] = [*headers, (b"authorization", b"Bearer " + key.strip())]
    return scope


def _request_id(headers: dict[bytes, bytes], ids: IdGenerator) -> str:
    given = headers.get(b"x-request-id", b"").decode("latin-1")
    return given if _REQUEST_ID.fullmatch(given) else ids.new()


def _body_deadline(receive: Receive, timeout_s: float) -> Receive:
    """`receive`, but the whole request body must arrive within `timeout_s` (a slow-body client gets 408).

    Later receives (the disconnect watchers of a streaming response) wait as long as they like.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    body_done = False

    async def receive_in_time() -> Message:
        nonlocal body_done
        if body_done:
            return await receive()
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise RequestTimeout(f"The request body did not arrive within {timeout_s:g} s.") from None
        body_done = message["type"] != "http.request" or not message.get("more_body", False)
        return message

    return receive_in_time


class GatewayMiddleware:
    def __init__(self, app: ASGIApp, ctx: GatewayContext) -> None:
        self.app = app
        self.ctx = ctx
        self._limit = ctx.config.max_concurrent_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope = _with_api_key(scope)
        headers = _headers(scope)
        rec = RequestRecord(_request_id(headers, self.ctx.ids), scope["method"], scope["path"], time.perf_counter())
        scope[SCOPE_KEY] = rec
        started = False
        admitted = False
        charged = False
        id_header = (b"x-request-id", rec.request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal started, charged
            if message["type"] == "http.response.start":
                started = True
                rec.status = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), id_header]}
            elif message["type"] == "http.response.body" and not message.get("more_body", False) and not charged:
                charged = True  # the usage is final: the ledger row is journaled before the last bytes leave
                self.ctx.spend.charge(rec)
            await send(message)

        try:
            self._guard(scope["path"], headers, rec)
            admitted = self._admit(scope)
            await self.app(scope, _body_deadline(receive, self.ctx.config.body_timeout_s), send_with_id)
        except Exception as exc:
            err = to_gateway_error(exc, retry_after_s=self.ctx.config.retry_after_s)
            self.ctx.report_error(rec, exc, err)
            if not started:
                anthropic = is_anthropic_path(scope["path"])
                response = anthropic_error_response(err, rec.request_id) if anthropic else error_response(err)
                await response(scope, receive, send_with_id)
        finally:
            if admitted:
                self.ctx.stats.in_flight -= 1
            if not charged:  # a stream the client left, an error: what it used is still charged
                self.ctx.spend.charge(rec)
            await self.ctx.guard.spend(rec)
            self._done(scope, rec)

    def _guard(self, path: str, headers: dict[bytes, bytes], rec: RequestRecord) -> None:
        """Check the key (an admin key for the operations pages) and the declared body size."""
        guard = self.ctx.guard
        if path in _OPS_PATHS or path.startswith(_ADMIN_PREFIX):
            guard.check_admin(headers.get(b"authorization"))
        elif path.startswith(_PROTECTED_PREFIX) or path in _KEYED_PATHS:
            rec.policy = guard.authenticate(headers.get(b"authorization"))
            rec.key = rec.policy.name
        length = headers.get(b"content-length")
        limit = self.ctx.config.max_body_bytes
        if path == _FILES_PATH:  # uploads (gateway/batches/): their own limit, checked again as they stream in
            limit = self.ctx.config.batches.max_file_bytes + 64 * 1024
        if length is not None and length.isdigit() and int(length) > limit:
            raise PayloadTooLarge(f"Request body too large: the limit is {limit} bytes.")

    def _admit(self, scope: Scope) -> bool:
        """Count a POST /v1/ request in flight, or turn it away (429) when `max_concurrent_requests` are."""
        if scope["method"] != "POST" or not scope["path"].startswith(_PROTECTED_PREFIX):
            return False
        stats = self.ctx.stats
        if self._limit and stats.in_flight >= self._limit:
            stats.rejected += 1
            raise ServerBusy(
                f"The server is busy: {self._limit} requests are in progress. Retry later.",
                retry_after_s=self.ctx.config.retry_after_s,
            )
        stats.in_flight += 1
        return True

    def _done(self, scope: Scope, rec: RequestRecord) -> None:
        route = scope.get("route")
        if route is not None:
            rec.route = getattr(route, "path", rec.route)
        rec.finish()
        self.ctx.metrics.observe(rec)
        if rec.path.startswith(_PROTECTED_PREFIX) and rec.path != _STATS_PATH:  # API traffic only
            self.ctx.stats.observe(rec)
        if self.ctx.config.access_log:
            log_request(self.ctx.logger, rec)
