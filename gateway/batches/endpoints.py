"""The HTTP side: /v1/files and /v1/batches, OpenAI's shapes (openapi.json: OpenAIFile, Batch, list objects)."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, Literal

from pydantic import ConfigDict
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from gateway.batches.config import BatchesConfig
from gateway.batches.files import PURPOSES, FileStore, expiry_seconds
from gateway.batches.runner import BatchRunner
from gateway.batches.storage import new_id, tenant_of
from gateway.batches.store import BatchStore
from gateway.batches.validate import ENDPOINTS
from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge, ServiceUnavailable
from gateway.protocol.declared import Declared
from gateway.protocol.generation import ClientDisconnected
from gateway.protocol.jsonio import json_response, read_json

COMPLETION_WINDOW_S = {"24h": 24 * 3600}


class BatchCreateBody(Declared):
    """POST /v1/batches: every field a client may send."""

    input_file_id: str  # an uploaded file of purpose "batch"
    endpoint: Literal[ENDPOINTS]  # type: ignore[valid-type]  # a tuple of strings: one Literal of each
    completion_window: Literal["24h"]
    metadata: dict[str, Any] | None = None  # at most 16 keys (64 chars) to strings (512 chars): _valid_metadata
    output_expires_after: dict[str, Any] | None = None  # {"anchor": "created_at", "seconds": N}: expiry_seconds


class ExpiresAfter(Declared):
    """OpenAI's {"anchor": "created_at", "seconds": N}, as text fields of a form: checked by expiry_seconds."""

    anchor: str | None = None
    seconds: str | None = None


class UploadForm(Declared):
    """POST /v1/files: the multipart form's fields (Starlette parses the body; the handler checks the file's size)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    file: UploadFile  # the file part itself
    purpose: Literal[PURPOSES]  # type: ignore[valid-type]  # a tuple of strings: one Literal of each
    expires_after: ExpiresAfter | None = None

    @classmethod
    def of(cls, form: FormData) -> UploadForm:
        """The form's fields; `a[b]` names a field of object `a`, as the SDKs send objects in a form."""
        fields: dict[str, Any] = {}
        for name, value in form.items():
            outer, _, inner = name.partition("[")
            if inner.endswith("]") and "[" not in inner:
                held = fields.setdefault(outer, {})
                if isinstance(held, dict):
                    held[inner[:-1]] = value
                    continue
            fields[name] = value
        return cls.parse(fields)


class Conflict(GatewayError):
    status = 409
    error_type = "invalid_request_error"


def _shown(obj: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's object without its unset (null) fields: the spec types them as plain strings and integers."""
    return {k: v for k, v in obj.items() if v is not None}


def _page(items: list[dict[str, Any]], after: str | None, limit: int) -> dict[str, Any]:
    ids = [i["id"] for i in items]
    start = ids.index(after) + 1 if after in ids else 0
    page = items[start : start + limit]
    return {
        "object": "list",
        "data": [_shown(i) for i in page],
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": start + limit < len(items),
    }


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise InvalidRequest(f"'limit' must be an integer from 1 to {most}.", param="limit")
    return value


class BatchEndpoints:
    def __init__(
        self, cfg: BatchesConfig, files: FileStore, store: BatchStore, runner: BatchRunner, *, keyed: bool, body_limit: int
    ) -> None:
        self.cfg, self.files, self.store, self.runner, self.keyed, self.body_limit = cfg, files, store, runner, keyed, body_limit
        # Set while another gateway holds the directory lock (service.py): every route answers 503 with its text.
        self.standby_reason: Callable[[], str] | None = None

    def tenant(self, request: Request) -> str:
        return tenant_of(request.headers.get("authorization"), self.keyed)

    def routes(self) -> list[Route]:
        table: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
            ("/v1/files", self.upload, "POST"),
            ("/v1/files", self.list_files, "GET"),
            ("/v1/files/{file_id}", self.get_file, "GET"),
            ("/v1/files/{file_id}", self.delete_file, "DELETE"),
            ("/v1/files/{file_id}/content", self.file_content, "GET"),
            ("/v1/batches", self.create_batch, "POST"),
            ("/v1/batches", self.list_batches, "GET"),
            ("/v1/batches/{batch_id}", self.get_batch, "GET"),
            ("/v1/batches/{batch_id}/cancel", self.cancel_batch, "POST"),
        ]
        return [Route(path, self._unless_standby(handler), methods=[method]) for path, handler, method in table]

    def _unless_standby(self, handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def guarded(request: Request) -> Response:
            if self.standby_reason is not None:
                raise ServiceUnavailable(self.standby_reason())
            return await handler(request)

        return guarded

    # ---- files ---------------------------------------------------------------------------------------

    async def upload(self, request: Request) -> Response:
        tenant = self.tenant(request)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise InvalidRequest("Upload a file as multipart/form-data with the fields `file` and `purpose`.")
        limit = self.cfg.max_file_bytes

        async def limited() -> AsyncGenerator[bytes, None]:
            size = 0
            try:
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit + 64 * 1024:  # the file plus its multipart framing
                        raise PayloadTooLarge(f"File too large: the limit is {limit} bytes.", param="file")
                    yield chunk
            except ClientDisconnect:
                raise ClientDisconnected("The client closed the connection before sending the whole body.") from None

        try:
            form = await MultiPartParser(request.headers, limited(), max_files=1, max_fields=8).parse()
        except MultiPartException as exc:
            raise InvalidRequest(f"Could not parse the multipart body: {exc.message}") from None
        try:
            fields = UploadForm.of(form)
            upload, purpose = fields.file, str(fields.purpose)
            size = upload.size if upload.size is not None else 0
            if size > limit:
                raise PayloadTooLarge(f"File too large: {size} bytes, the limit is {limit} bytes.", param="file")
            if size == 0:
                raise InvalidRequest("The file is empty.", param="file")
            expires_s = self._upload_expiry(fields, purpose)
            tmp = self.files.temp_path(tenant)
            with open(tmp, "wb") as out:
                await upload.seek(0)
                while chunk := await upload.read(1 << 20):
                    out.write(chunk)
            meta = self.files.create(tenant, upload.filename or "upload.jsonl", purpose, tmp, expires_s=expires_s)
        finally:
            await form.close()
        return json_response(_shown(meta))

    def _upload_expiry(self, form: UploadForm, purpose: str) -> int | None:
        """Seconds until the upload expires: its `expires_after`, else `batch_file_expiry_s` for purpose batch, else
        never."""
        given = form.expires_after
        if given is not None and (given.anchor is not None or given.seconds is not None):
            return expiry_seconds(given.model_dump(), "expires_after", self.cfg.min_expiry_s)
        if purpose == "batch" and self.cfg.batch_file_expiry_s:
            return self.cfg.batch_file_expiry_s
        return None

    async def list_files(self, request: Request) -> Response:
        purpose = request.query_params.get("purpose")
        order = request.query_params.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("'order' must be 'asc' or 'desc'.", param="order")
        items = self.files.list(self.tenant(request), purpose)
        items.sort(key=lambda m: m["id"], reverse=order == "desc")
        return json_response(_page(items, request.query_params.get("after"), _limit(request, 10_000, 10_000)))

    async def get_file(self, request: Request) -> Response:
        return json_response(_shown(self.files.get(self.tenant(request), request.path_params["file_id"])))

    async def file_content(self, request: Request) -> Response:
        path = self.files.data_path(self.tenant(request), request.path_params["file_id"])
        return FileResponse(path, media_type="application/octet-stream")

    async def delete_file(self, request: Request) -> Response:
        return json_response(self.files.delete(self.tenant(request), request.path_params["file_id"]))

    # ---- batches -------------------------------------------------------------------------------------

    async def create_batch(self, request: Request) -> Response:
        tenant = self.tenant(request)
        body = BatchCreateBody.parse(await read_json(request, self.body_limit))
        endpoint, window, metadata, file_id = body.endpoint, body.completion_window, body.metadata, body.input_file_id
        if metadata is not None and not _valid_metadata(metadata):
            raise InvalidRequest("'metadata' must map at most 16 keys (64 chars) to strings (512 chars).", param="metadata")
        meta = self.files.get(tenant, file_id)
        if meta["purpose"] != "batch":
            raise InvalidRequest(
                f"The file {file_id} has purpose {meta['purpose']!r}: a batch input needs 'batch'.", param="input_file_id"
            )
        output_expiry = None
        if body.output_expires_after is not None:
            output_expiry = expiry_seconds(body.output_expires_after, "output_expires_after", self.cfg.min_expiry_s)
        now = int(time.time())
        obj: dict[str, Any] = {
            "id": new_id("batch_"), "object": "batch", "endpoint": endpoint, "model": None, "errors": None,
            "input_file_id": file_id, "completion_window": window, "status": "validating", "output_file_id": None,
            "error_file_id": None, "created_at": now, "in_progress_at": None, "expires_at": now + COMPLETION_WINDOW_S[window],
            "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": metadata,
        }  # fmt: skip
        job = self.store.create(tenant, obj, self.files.data_path(tenant, file_id), output_expiry)
        self.runner.submit(job)
        return json_response(_shown(job.obj))

    async def get_batch(self, request: Request) -> Response:
        return json_response(_shown(self.store.get(self.tenant(request), request.path_params["batch_id"]).obj))

    async def list_batches(self, request: Request) -> Response:
        items = [j.obj for j in self.store.list(self.tenant(request))]
        return json_response(_page(items, request.query_params.get("after"), _limit(request, 20, 100)))

    async def cancel_batch(self, request: Request) -> Response:
        job = self.store.get(self.tenant(request), request.path_params["batch_id"])
        if job.status not in ("validating", "in_progress", "cancelling"):
            raise Conflict(f"Cannot cancel a batch with status '{job.status}'.", param="batch_id")
        self.runner.cancel(job)
        return json_response(_shown(job.obj))


def _valid_metadata(value: object) -> bool:
    return (
        isinstance(value, dict)
        and len(value) <= 16
        and all(isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 for k, v in value.items())
    )
