"""Errors in Anthropic's shape: `{"type": "error", "error": {"type", "message"}, "request_id"}`.

The gateway's one exception tree (gateway/errors.py) is kept; only the rendering differs on the
Anthropic paths. Status codes are the gateway's, except that "the server cannot take it now"
(503, and 429s that mean the server is busy rather than the key's limit) is Anthropic's 529
`overloaded_error`, which Anthropic clients retry.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response

from gateway.errors import GatewayError, ServerBusy, ServiceUnavailable
from gateway.ops.sent import sent

PATH = "/v1/messages"
OVERLOADED = 529
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    504: "timeout_error",
    OVERLOADED: "overloaded_error",
}
# An OpenAI error body met inside a chat stream (its status is gone): its type/code -> Anthropic's type.
_FROM_OPENAI = {
    "invalid_request_error": "invalid_request_error",
    "rate_limit_error": "rate_limit_error",
    "insufficient_quota": "billing_error",
    "service_unavailable": "overloaded_error",
    "all_deployments_failed": "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def status_of(err: GatewayError) -> int:
    if isinstance(err, ServiceUnavailable | ServerBusy):
        return OVERLOADED
    return err.status


def error_type(status: int) -> str:
    return _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(err: GatewayError, request_id: str | None = None) -> dict[str, object]:
    kind = "billing_error" if err.error_type == "insufficient_quota" else error_type(status_of(err))  # a spent budget
    body: dict[str, object] = {"type": "error", "error": {"type": kind, "message": err.message}}
    if request_id:
        body["request_id"] = request_id
    return body


def error_response(err: GatewayError, request_id: str | None = None) -> Response:
    headers = {**err.headers(), **({"request-id": request_id} if request_id else {})}
    return Response(
        orjson.dumps(error_body(err, request_id)), status_code=status_of(err), headers=headers, media_type="application/json"
    )


def sse_event(name: str, data: dict[str, object]) -> bytes:
    sent(data)
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def from_openai_body(body: object, request_id: str | None = None) -> dict[str, object]:
    """An OpenAI `{"error": {...}}` (a chat stream's error event, a non-200 body) in Anthropic's shape."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    kind = _FROM_OPENAI.get(str(error.get("code")), _FROM_OPENAI.get(str(error.get("type")), "api_error"))
    out: dict[str, object] = {"type": "error", "error": {"type": kind, "message": str(error.get("message") or "Upstream error.")}}
    if request_id:
        out["request_id"] = request_id
    return out
