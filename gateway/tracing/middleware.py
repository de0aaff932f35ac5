"""TracingMiddleware: one SERVER span per API request, the parent of every span the request makes.

It runs outside GatewayMiddleware (gateway/middleware.py), so rejected requests (401, 413, 429) are traced too, and
reads the RequestRecord that middleware puts into the same scope when the response is over: status, the model that
answered, usage, the time to first token (an event at that time), the cache's verdict. An incoming `traceparent`
makes the span a child of the caller's. Only /v1/ requests are traced (not probes, /metrics, the dashboard).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.ops.record import SCOPE_KEY, RequestRecord
from gateway.ops.sent import capturing
from gateway.tracing import genai
from gateway.tracing.otel import OtelSpan, Tracing
from gateway.tracing.spans import traced_by

_TRACED_PREFIX = "/v1/"
_UNTRACED = frozenset({"/v1/stats"})  # the dashboard's polling
_PROPAGATION = (b"traceparent", b"tracestate")
_MAX_BODY_ATTRS = 1 << 20  # request bodies up to this size are read for gen_ai.request.* (uploads are not)


class TracingMiddleware:
    def __init__(self, app: ASGIApp, tracing: Tracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(_TRACED_PREFIX) or path in _UNTRACED:
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        operation = genai.OPERATIONS.get(path) if method == "POST" else None
        carrier = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _PROPAGATION}
        started_ns = time.time_ns()
        span = self.tracing.span(
            f"{method} {path}", "server",
            {"http.request.method": method, "url.path": path, "gen_ai.operation.name": operation},
            parent=self.tracing.extract(carrier), start_ns=started_ns,
        )  # fmt: skip
        body: list[bytes] = []
        answer: list[object] = []  # with traces.content: the answer objects the endpoint sent (gateway/ops/sent.py)
        status = body_size = 0

        async def receive_body() -> Message:
            nonlocal body_size
            message = await receive()
            if message["type"] == "http.request" and body_size < _MAX_BODY_ATTRS:
                body.append(chunk := message.get("body", b""))
                body_size += len(chunk)
            return message

        async def send_answer(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        # Only a request that runs a model offers the tracer to the code it runs: work started by another request
        # outlives it in a task that inherits its context (POST /v1/batches starts the batch), and must not be
        # traced as that request's children.
        inner = traced_by(self.tracing) if operation else nullcontext()
        capture = capturing() if operation and self.tracing.content else nullcontext(answer)
        try:
            with span.current(), inner, capture as sent_objects:
                answer = sent_objects
                await self.app(scope, receive_body if operation else receive, send_answer)
        except BaseException as exc:
            span.fail(type(exc).__name__)
            raise
        finally:
            rec = scope.get(SCOPE_KEY)
            self._finish(span, path, rec if isinstance(rec, RequestRecord) else None, status, body=body, answer=answer,
                started_ns=started_ns)

    def _finish(
        self, span: OtelSpan, path: str, rec: RequestRecord | None, status: int, *, body: list[bytes], answer: list[object],
        started_ns: int,
    ) -> None:
        """The request's attributes, read once the response is over (it is already the client's: this costs it no
        latency)."""
        if not span.recording:
            span.end()
            return
        try:
            parsed = _json(b"".join(body)) if body else None
            if parsed is not None:
                span.set_all(genai.request_attributes(parsed))
            if rec is not None:
                span.rename(f"{rec.method} {rec.route}" if rec.route != "unmatched" else f"{rec.method} {path}")
                span.set_all({"http.route": rec.route if rec.route != "unmatched" else None, **genai.record_attributes(rec)})
                status = rec.status or status
                if rec.ttft_s is not None:
                    span.event("gen_ai.first_token", {"gen_ai.response.time_to_first_chunk": rec.ttft_s},
                               at_ns=started_ns + int(rec.ttft_s * 1e9))  # fmt: skip
                if rec.error_type is not None:
                    span.set("error.type", rec.error_type)
            span.set("http.response.status_code", status or None)
            if status >= 500:
                span.fail(rec.error_type if rec is not None and rec.error_type else str(status))
            if self.tracing.content:
                limit = self.tracing.max_content_chars
                span.set("gen_ai.input.messages", genai.input_messages(path, parsed, limit) if parsed else None)
                span.set("gen_ai.output.messages", genai.output_messages(answer, path, limit) if answer else None)
        finally:
            span.end()


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
