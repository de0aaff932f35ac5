"""The tracing calls the request path makes: `start`/`span` a child of the current span, without importing
OpenTelemetry.

A traced request (gateway/tracing/middleware.py) puts its Tracer in a context variable; every call here asks it. An
untraced request (tracing off, or a path that is not traced) finds none and gets NO_SPAN, whose methods do nothing:
the cost of tracing off is one ContextVar lookup per call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from types import TracebackType
from typing import Literal, Protocol

AttrValue = str | bool | int | float | list[str]
Kind = Literal["internal", "client", "server"]


class Span(Protocol):
    """One span; `end` is idempotent. Used as a context manager it is the current span inside and ends on exit."""

    def set(self, key: str, value: AttrValue | None) -> None: ...

    def set_all(self, attrs: Mapping[str, AttrValue | None]) -> None: ...

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None: ...

    def fail(self, error_type: str, message: str = "") -> None:
        """Mark it failed: status ERROR and `error.type` (the message must hold no secret: it is redacted anyway)."""
        ...

    def end(self) -> None: ...

    def current(self) -> AbstractContextManager[None]:
        """Make it the current span (the parent of spans started inside) without ending it on exit."""
        ...

    def headers(self) -> dict[str, str]:
        """W3C trace-context headers (traceparent, tracestate) for a call made on behalf of this span."""
        ...

    def __enter__(self) -> Span: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None: ...


class Tracer(Protocol):
    """What a traced request offers the code it runs (gateway/tracing/otel.py's RequestTracer)."""

    content: bool  # whether prompts and completions may be recorded

    def start(self, name: str, kind: Kind = "internal", attrs: Mapping[str, AttrValue | None] | None = None) -> Span: ...


class _NoSpan:
    """The span of an untraced request: every call does nothing."""

    def set(self, key: str, value: AttrValue | None) -> None: ...

    def set_all(self, attrs: Mapping[str, AttrValue | None]) -> None: ...

    def event(self, name: str, attrs: Mapping[str, AttrValue] | None = None) -> None: ...

    def fail(self, error_type: str, message: str = "") -> None: ...

    def end(self) -> None: ...

    def current(self) -> AbstractContextManager[None]:
        return nullcontext()

    def headers(self) -> dict[str, str]:
        return {}

    def __enter__(self) -> Span:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None: ...


NO_SPAN: Span = _NoSpan()
_TRACER: ContextVar[Tracer | None] = ContextVar("smolgate_tracer", default=None)


def tracer() -> Tracer | None:
    """This request's tracer; None when it is not traced."""
    return _TRACER.get()


def start(name: str, kind: Kind = "internal", attrs: Mapping[str, AttrValue | None] | None = None) -> Span:
    """A child of the current span (end it, or use it as a context manager); NO_SPAN when the request is untraced."""
    t = _TRACER.get()
    return NO_SPAN if t is None else t.start(name, kind, attrs)


@contextmanager
def traced_by(t: Tracer) -> Iterator[None]:
    """Run the block as a request `t` traces."""
    token = _TRACER.set(t)
    try:
        yield
    finally:
        _TRACER.reset(token)
