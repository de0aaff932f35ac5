"""Reading JSON request bodies (with a size limit) and writing JSON responses, with orjson."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.ops.sent import sent
from gateway.protocol.generation import ClientDisconnected


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The body as a JSON object; 413 beyond `limit` bytes, 400 when it is not a JSON object."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"Request body too large: the limit is {limit} bytes.")
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body arrived: a 499 in the log, not a server error
        raise ClientDisconnected("The client closed the connection before sending the whole body.") from None
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        raise InvalidRequest("We could not parse the JSON body of your request. The body must be a valid JSON object.") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


def json_response(obj: Any, status: int = 200) -> Response:
    sent(obj)
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")
