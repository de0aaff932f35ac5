"""The gateway's one exception tree, and its single translation to OpenAI error JSON.

Every failure (a bad request, an engine error, an unexpected bug) ends up as
`{"error": {"message", "type", "param", "code"}}` with the status code the OpenAI
SDK maps to the matching exception class. `to_gateway_error` is the only place
where foreign exceptions are translated.
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson
from starlette.exceptions import HTTPException
from starlette.responses import Response

from backend.errors import ContextLengthError, EngineDeadError, InvalidRequestError, QueueFullError


class GatewayError(Exception):
    """Base class: an error with an HTTP status and an OpenAI error body."""

    # class defaults a subclass sets, and an instance may too (a relayed error keeps its upstream's type and status)
    status: int = 500
    error_type: str = "server_error"
    default_code: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def headers(self) -> dict[str, str]:
        return {}


class InvalidRequest(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class NotFound(GatewayError):
    status = 404
    error_type = "invalid_request_error"


class ModelNotFound(NotFound):
    default_code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    error_type = "invalid_request_error"


class RequestTimeout(GatewayError):
    status = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class RateLimited(GatewayError):
    status = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class ServerBusy(RateLimited):
    """The server, not the caller's key, is at capacity (queue full, too many requests in flight)."""


class QuotaExceeded(GatewayError):
    """A key's (or its team's) spend budget is used up: OpenAI's `insufficient_quota` (its SDK: RateLimitError)."""

    status = 429
    error_type = "insufficient_quota"
    default_code = "insufficient_quota"


class InternalError(GatewayError):
    status = 500
    error_type = "server_error"
    default_code = "internal_error"


class ServiceUnavailable(GatewayError):
    status = 503
    error_type = "server_error"
    default_code = "service_unavailable"


_HTTP_STATUS: dict[int, type[GatewayError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    404: NotFound,
    405: MethodNotAllowed,
    413: PayloadTooLarge,
    503: ServiceUnavailable,
}


def to_gateway_error(exc: BaseException, *, retry_after_s: int = 1) -> GatewayError:
    """Translate any exception into a GatewayError (never leaks internal messages)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, ContextLengthError):
        return InvalidRequest(str(exc), param=exc.param or "messages", code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return InvalidRequest(str(exc), param=exc.param)
    if isinstance(exc, QueueFullError):
        return ServerBusy("The server is busy: its request queue is full. Retry later.", retry_after_s=retry_after_s)
    if isinstance(exc, EngineDeadError):
        return ServiceUnavailable("The inference engine is not running.")
    if isinstance(exc, HTTPException):
        return _from_http_exception(exc)
    return InternalError("The server had an internal error while processing the request.")


def _from_http_exception(exc: HTTPException) -> GatewayError:
    cls = _HTTP_STATUS.get(exc.status_code, InternalError)
    if exc.status_code == 404:
        return NotFound("Unknown route: no such endpoint.", code="unknown_url")
    if exc.status_code == 405:
        return MethodNotAllowed("Method not allowed on this endpoint.")
    return cls(str(exc.detail))


def error_body(err: GatewayError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.error_type, "param": err.param, "code": err.code}}


def error_bytes(err: GatewayError) -> bytes:
    return orjson.dumps(error_body(err))


def error_response(err: GatewayError) -> Response:
    return Response(error_bytes(err), status_code=err.status, headers=err.headers(), media_type="application/json")
