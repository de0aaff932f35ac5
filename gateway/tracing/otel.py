"""The OpenTelemetry side of tracing: one gateway's tracer provider, its OTLP/HTTP exporter, and the spans it makes.

Imported only when `traces.endpoint` is set (gateway/app.py), so a gateway without it loads no SDK. The provider is
this gateway's own, not the process-global one: two gateways in one process (tests, a router beside its backend)
each export under their own service name, and nothing else in the process starts exporting by accident.
Spans are handed to a BatchSpanProcessor: exporting runs on its thread, never on a request's path; a collector that
is down costs dropped spans (the processor's queue is bounded), not latency.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import Token
from types import TracebackType

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.tracing.config import TracesConfig
from gateway.tracing.spans import AttrValue, Kind, Span

_KINDS = {"internal": SpanKind.INTERNAL, "client": SpanKind.CLIENT, "server": SpanKind.SERVER}
_REDACTED = "[redacted]"


class Redactor:
    """Replaces every configured secret (API keys, upstream keys) in a string: keys never reach a trace, even when a
    client pastes one into a prompt or an upstream echoes one in an error."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))  # longest first: no partial leftovers

    def __call__(self, value: str) -> str:
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, _REDACTED)
        return value

    def value(self, value: AttrValue) -> AttrValue:
        if isinstance(value, str):
            return self(value)
        if isinstance(value, list):
            return [self(v) for v in value]
        return value


class Tracing:
    """A gateway's tracer: builds spans (as the request path's Tracer, gateway/tracing/spans.py) and exports them."""

    def __init__(self, cfg: TracesConfig, secrets: tuple[str, ...], exporter: SpanExporter | None = None) -> None:
        """`exporter`: where spans go; the OTLP/HTTP exporter to `cfg.endpoint` unless given (its other settings,
        headers, timeout, compression, come from the standard OTEL_EXPORTER_OTLP_* variables, which it reads)."""
        self.content = cfg.content
        self.max_content_chars = cfg.max_content_chars
        self.redact = Redactor(secrets)
        self.provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=cfg.endpoint)))
        self.tracer = self.provider.get_tracer("smolgate")
        self.propagator = TraceContextTextMapPropagator()

    def extract(self, carrier: Mapping[str, str]) -> otel_context.Context:
        """The context an incoming request's `traceparent` / `tracestate` name (an empty one without them)."""
        return self.propagator.extract(carrier)

    def start(self, name: str, kind: Kind = "internal", attrs: Mapping[str, AttrValue | None] | None = None) -> Span:
        """A child of the current span."""
        return self.span(name, kind, attrs)

    def span(
        self,
        name: str,
        kind: Kind = "internal",
        attrs: Mapping[str, AttrValue | None] | None = None,
        parent: otel_context.Context | None = None,
        *,
        start_ns: int | None = None,
    ) -> OtelSpan:
        """A span under `parent` (default: the current context), started at `start_ns` (default: now)."""
        raw = self.tracer.start_span(name, parent, _KINDS[kind], start_time=start_ns, record_exception=False,
                                     set_status_on_exception=False)  # fmt: skip
        span = OtelSpan(raw, self)
        if attrs:
            span.set_all(attrs)
        return span

    def flush(self, timeout_s: float = 10.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Export what is queued, then stop (the app's lifespan end), waiting `timeout_s` at most: the SDK's own
        shutdown waits up to 30 s per processor, retrying a collector that is down, and a gateway must not take that
        long to stop. What is left then is dropped (the exporting thread is a daemon)."""
        worker = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        worker.start()
        worker.join(timeout_s)


class OtelSpan:
    """gateway/tracing/spans.py's Span over an SDK span; every string that goes in is redacted."""

    __slots__ = ("_ended", "_tokens", "raw", "tracing")

    def __init__(self, raw: trace.Span, tracing: Tracing) -> None:
        self.raw = raw
        self.tracing = tracing
        self._tokens: list[Token[otel_context.Context]] = []
        self._ended = False

    def set(self, key: str, value: AttrValue | None) -> None:
        if value is not None:
            self.raw.set_attribute(key, self.tracing.redact.value(value))

    def set_all(self, attrs: Mapping[str, AttrValue | None]) -> None:
        redact = self.tracing.redact.value
        self.raw.set_attributes({k: redact(v) if isinstance(v, str | list) else v for k, v in attrs.items() if v is not None})

    @property
    def recording(self) -> bool:
        """False for a span the sampler dropped (OTEL_TRACES_SAMPLER): then nothing it would record is worth working out."""
        return self.raw.is_recording()

    def rename(self, name: str) -> None:
        self.raw.update_name(name)

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None, at_ns: int | None = None) -> None:
        self.raw.add_event(name, attrs, timestamp=at_ns)

    def fail(self, error_type: str, message: str = "") -> None:
        self.raw.set_attribute("error.type", error_type)
        self.raw.set_status(Status(StatusCode.ERROR, self.tracing.redact(message) or None))

    def end(self, at_ns: int | None = None) -> None:
        if not self._ended:  # the SDK warns on a second end
            self._ended = True
            self.raw.end(at_ns)

    def context(self) -> otel_context.Context:
        return trace.set_span_in_context(self.raw)

    def current(self) -> AbstractContextManager[None]:
        return self._current()

    @contextmanager
    def _current(self) -> Iterator[None]:
        token = otel_context.attach(self.context())
        try:
            yield
        finally:
            otel_context.detach(token)

    def headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        self.tracing.propagator.inject(carrier, self.context())
        return carrier

    def __enter__(self) -> Span:
        self._tokens.append(otel_context.attach(self.context()))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        otel_context.detach(self._tokens.pop())
        if exc is not None:  # the type only: an exception's message may quote the request
            self.fail(type(exc).__name__)
        self.end()


def epoch_clock() -> Callable[[float], int]:
    """Converts time.monotonic() readings of this process to the Unix-epoch nanoseconds spans carry; one offset for all
    the readings of a request, so equal readings stay equal and ordered ones stay ordered."""
    offset = time.time_ns() - time.monotonic_ns()
    return lambda monotonic_s: offset + int(monotonic_s * 1e9)
