"""structlog JSON logging: one line per request, plus the occasional server event.

The logger is built per app and writes to a given stream. The one global piece, installed by the composition root
(gateway/__main__.py), is `route_stdlib_logging`: the standard library's records (backend/ and kernels/ log that way,
as do uvicorn and the libraries) are rendered by the same processors to the same stream, so the operator reads one
format. Headers are never logged, so API keys never reach the log; the configured secrets are also
redacted from every rendered line.
"""

from __future__ import annotations

import logging
from typing import Any, TextIO

import orjson
import structlog
from structlog.typing import FilteringBoundLogger

from gateway.ops.record import RequestRecord

Logger = FilteringBoundLogger  # the gateway's logger (make_logger), passed to every part that logs


def _dumps(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def _redactor(secrets: tuple[str, ...]) -> Any:
    """A structlog processor taking every configured secret out of the rendered line (defence in depth: no code
    path logs a key, but an upstream's error text or a traceback might carry one)."""
    ordered = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)  # shorter ones: ordinary words

    def redact(logger: Any, method: str, line: str) -> str:
        for secret in ordered:
            if secret in line:
                line = line.replace(secret, "[redacted]")
        return line

    return redact


def _processors(secrets: tuple[str, ...]) -> list[Any]:
    """Every line's chain, the gateway's own and the standard library's: level, UTC time, traceback, JSON, redaction."""
    return [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        structlog.processors.JSONRenderer(serializer=_dumps),
        *([_redactor(secrets)] if secrets else []),
    ]


def make_logger(sink: TextIO, level: str = "info", secrets: tuple[str, ...] = ()) -> Logger:
    """A JSON-lines structlog logger writing to `sink`; `secrets` never appear in a line."""
    logger: Logger = structlog.wrap_logger(
        structlog.WriteLogger(sink),
        processors=_processors(secrets),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        cache_logger_on_first_use=True,
    )
    return logger


OWN_LOGGERS = ("backend", "kernels", "gateway")  # uvicorn sets its own loggers' level (uvicorn.run's log_level)


class _StdlibHandler(logging.StreamHandler[TextIO]):
    """The root logger's handler route_stdlib_logging installs (its type marks it, so a second call replaces it)."""


def route_stdlib_logging(sink: TextIO, level: str = "info", secrets: tuple[str, ...] = ()) -> logging.Handler:
    """Renders standard-library records as make_logger's lines are (plus `logger`, the record's logger name) and writes
    them to `sink`: one handler on the root logger, replacing any earlier one. The project's own loggers (backend,
    kernels, gateway) speak from `level`, the libraries' from warning (httpx logs every upstream request at info)."""
    handler = _StdlibHandler(sink)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_processors(secrets)],
    ))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.getLevelNamesMapping()[level.upper()])
    return handler


def log_request(logger: Logger, rec: RequestRecord) -> None:
    logger.info(
        "request",
        request_id=rec.request_id,
        method=rec.method,
        path=rec.path,
        route=rec.route,
        model=rec.model or None,
        deployment=rec.deployment or None,
        status=rec.status,
        stream=rec.stream,
        user=rec.user,
        prompt_tokens=rec.prompt_tokens,
        completion_tokens=rec.completion_tokens,
        cached_tokens=rec.cached_tokens,
        ttft_ms=None if rec.ttft_s is None else round(rec.ttft_s * 1000, 3),
        latency_ms=round(rec.latency_s * 1000, 3),
        cache=rec.cache,
        error=rec.error_type,
    )
