"""The /v1/responses routes: create (JSON or an event stream), retrieve, delete, input items, input tokens.

Creating a response: the request is validated here (request.py), the conversation is rebuilt from the
stored previous response, and the chat-completions body runs through `chat` — the same handler
/v1/chat/completions uses (or the router's), so keys, limits, priorities, the response cache, routing,
metrics and the access log treat it like any chat request. Its output becomes the Response object.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.context import GatewayContext
from gateway.errors import GatewayError, InvalidRequest, NotFound, error_body, to_gateway_error
from gateway.openai_responses.builder import Event, ResponseBuilder, feed_completion, feed_events, replay_events
from gateway.openai_responses.items import chat_messages
from gateway.openai_responses.request import ResponsesRequest, chat_body, echo_fields, parse_request
from gateway.openai_responses.store import StoredResponses, build_store
from gateway.openai_responses.tokens import TokenCounter
from gateway.ops.record import RequestRecord, record_of
from gateway.ops.sent import sent
from gateway.protocol.answer import run_json
from gateway.protocol.events import Failed, Steps, steps_of
from gateway.protocol.jsonio import json_response, read_json
from gateway.protocol.sse import SSEStream, StreamLimits

ChatHandler = Callable[[Request, dict[str, Any]], Awaitable[Response]]
_PASSED_HEADERS = ("x-cache", "x-cache-similarity", "x-smolgate-")
_PARAMS = (
    (re.compile(r"^messages.*"), "input"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
    (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
)


def _event_bytes(event: Event) -> bytes:
    sent(event)
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class StreamBroke(GatewayError):
    """The chat stream failed (its OpenAI error body is kept)."""

    def __init__(self, body: dict[str, Any]) -> None:
        found = body.get("error")
        err: dict[str, Any] = found if isinstance(found, dict) else {}
        super().__init__(str(err.get("message") or "The stream failed."), param=err.get("param"), code=err.get("code"))
        self.error_type = str(err.get("type") or "server_error")
        self.status = 429 if self.error_type == "rate_limit_error" else 500


def passed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The chat answer's cache and routing headers, for the Response."""
    return {k: v for k, v in headers.items() if k.startswith(_PASSED_HEADERS)}


def _notes(req: ResponsesRequest) -> dict[str, str]:
    """What the response says about the request beyond the API's own fields: the tools left out."""
    return {"smolgate-tools-left-out": ",".join(req.left_out)} if req.left_out else {}


def _renamed(err: InvalidRequest) -> InvalidRequest:
    """A chat-pipeline 400 with its parameter named as the Responses request names it."""
    old = err.param
    if old:
        new = old
        for pattern, repl in _PARAMS:
            new = pattern.sub(repl, new)
        err.param = new
        if new != old:
            err.message = err.message.replace(f"'{old}'", f"'{err.param}'")
    return err


class ResponsesAPI:
    def __init__(self, ctx: GatewayContext, chat: ChatHandler, store: StoredResponses | None = None) -> None:
        self.ctx = ctx
        self.chat = chat
        self.store = store if store is not None else build_store(ctx.config, ctx.logger)
        self.tokens = TokenCounter(ctx)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/input_tokens", self.input_tokens, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}", self.delete, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", self.input_items, methods=["GET"]),
        ]

    async def close(self) -> None:
        await self.store.close()

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}{self.ctx.ids.new()}"

    # ---- POST /v1/responses ----------------------------------------------------------------------------

    async def _conversation(self, request: Request, req: ResponsesRequest) -> list[dict[str, Any]]:
        """The items before this request's input: the previous response's context, input and output."""
        if req.previous_response_id is None:
            return []
        record = await self.store.get(request.headers.get("authorization"), req.previous_response_id)
        if record is None:
            raise NotFound(f"Previous response with id '{req.previous_response_id}' not found.", param="previous_response_id")
        return [*record["context"], *record["input"], *record["response"]["output"]]

    async def _chat_request(self, request: Request, req: ResponsesRequest) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        history = await self._conversation(request, req)
        messages = chat_messages([*history, *req.input], len(history))
        body = chat_body(req, messages, req.model)
        if req.truncation == "auto":
            body = self.tokens.truncated(body, req.max_output_tokens)
        if req.max_output_tokens is None and self.tokens.exact(body):
            # No limit asked (Codex asks none): the answer may use what the context leaves, up to the key's cap
            # (else the key's default max_tokens, added to a long prompt, would overflow the context)
            rec = record_of(request)
            cap = (rec.policy if rec.policy is not None else self.ctx.guard.anonymous).max_tokens
            room = self.tokens.limit(body) - self.tokens.count(body)
            if room > 0 and (not cap or room < cap):
                body["max_completion_tokens"] = room
        return history, body

    async def create(self, request: Request) -> Response:
        rec = record_of(request)
        raw = await read_json(request, self.ctx.config.max_body_bytes)
        req = parse_request(raw, self._new_id, strict=self.ctx.config.strict_params)
        try:
            history, body = await self._chat_request(request, req)
            inner = await self.chat(request, body)
        except Exception as exc:  # the chat pipeline's 400s (the engine's too) name Responses fields
            err = to_gateway_error(exc, retry_after_s=self.ctx.config.retry_after_s)
            if isinstance(err, InvalidRequest):
                raise _renamed(err) from None
            raise
        base = {**echo_fields(req)}
        builder = ResponseBuilder(self._new_id("resp_"), base, self._new_id)
        builder.model = req.model
        record = {"input": req.input, "context": history}
        auth = request.headers.get("authorization")
        if not req.stream:
            captured, answer = await run_json(inner, request.scope)
            out = feed_completion(builder, answer)
            if req.store:
                await self.store.put(auth, builder.id, {**record, "response": out})
            response = json_response(out)
            response.headers.update({**passed_headers(captured.headers), **_notes(req)})
            return response
        steps = steps_of(inner)

        async def save(out: dict[str, object]) -> None:
            if req.store:
                await self.store.put(auth, builder.id, {**record, "response": out})

        events = self._events(builder, steps, save, rec)
        stream = SSEStream(events, [steps], StreamLimits.of(self.ctx.config), rec.client_disconnected)
        stream.headers.update({**passed_headers(inner.headers), **_notes(req)})
        return stream

    async def _events(
        self, builder: ResponseBuilder, steps: Steps, save: Callable[[dict[str, object]], Awaitable[None]], rec: RequestRecord
    ) -> AsyncGenerator[bytes, None]:
        """The chat answer's steps in, Responses events out; one write per step. A failure ends the stream with an
        `error` event and response.failed."""
        async with aclosing(steps):
            try:
                events: list[Event] | None = None
                async for step in steps:
                    failed = next((e for e in step.events if isinstance(e, Failed)), None)
                    if failed is not None:  # reported where it happened; its OpenAI body is what the client reads
                        events = builder.start("") + builder.fail(StreamBroke(error_body(failed.error)))
                        break
                    made = feed_events(builder, step.events)
                    if made:
                        yield b"".join(_event_bytes(e) for e in made)
                if events is None:
                    if builder.finish_reason is None:
                        raise StreamBroke({"error": {"message": "The stream ended before the response was complete."}})
                    events = builder.complete()
            except Exception as exc:
                err = to_gateway_error(exc, retry_after_s=self.ctx.config.retry_after_s)
                self.ctx.report_error(rec, exc, err)
                events = builder.start("") + builder.fail(err)
        await save(builder.response())
        yield b"".join(_event_bytes(e) for e in events)

    # ---- stored responses ------------------------------------------------------------------------------

    async def _stored(self, request: Request) -> tuple[str, dict[str, Any]]:
        response_id = request.path_params["response_id"]
        record = await self.store.get(request.headers.get("authorization"), response_id)
        if record is None:
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return response_id, record

    async def retrieve(self, request: Request) -> Response:
        _, record = await self._stored(request)
        stored = record["response"]
        query = request.query_params
        stream = query.get("stream", "false").lower() == "true"
        if not stream:
            return json_response(stored)
        after = _int_param(query.get("starting_after"), "starting_after", -1, None)
        base = {k: v for k, v in stored.items() if k not in _BUILT_FIELDS}
        ids = iter([item["id"] for item in stored.get("output") or ()])
        builder = ResponseBuilder(stored["id"], base, lambda prefix: next(ids, f"{prefix}{self.ctx.ids.new()}"))
        builder.created_at = stored["created_at"]
        events = replay_events(builder, stored)[(after if after is not None else -1) + 1 :]  # sequence numbers count from 0

        async def send() -> AsyncGenerator[bytes, None]:
            yield b"".join(_event_bytes(e) for e in events)

        rec = record_of(request)
        return SSEStream(send(), [], StreamLimits.of(self.ctx.config), rec.client_disconnected)

    async def delete(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        if not await self.store.delete(request.headers.get("authorization"), response_id):
            raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
        return json_response({"id": response_id, "object": "response", "deleted": True})

    async def input_items(self, request: Request) -> Response:
        _, record = await self._stored(request)
        query = request.query_params
        limit = _int_param(query.get("limit"), "limit", 1, 100) or 20
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest(f"Invalid value for 'order': {order!r}; expected 'asc' or 'desc'.", param="order")
        items = list(record["input"])
        if order == "desc":
            items.reverse()
        for cursor, forward in ((query.get("after"), True), (query.get("before"), False)):
            if cursor is None:
                continue
            ids = [item["id"] for item in items]
            if cursor not in ids:
                raise InvalidRequest(
                    f"No input item with id '{cursor}' in this response.", param="after" if forward else "before"
                )
            at = ids.index(cursor)
            items = items[at + 1 :] if forward else items[:at]
        page = items[:limit]
        return json_response(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            }
        )

    async def input_tokens(self, request: Request) -> Response:
        raw = await read_json(request, self.ctx.config.max_body_bytes)
        req = parse_request(raw, self._new_id, counting=True, strict=self.ctx.config.strict_params)
        if not req.input and req.previous_response_id is None:
            raise InvalidRequest("Missing required parameter: 'input' (or 'previous_response_id').", param="input")
        history = await self._conversation(request, req)
        messages = chat_messages([*history, *req.input], len(history))
        body = chat_body(req, messages, req.model or self.ctx.engine.model_name)
        try:
            if req.truncation == "auto":
                body = self.tokens.truncated(body, req.max_output_tokens)
            count = self.tokens.count(body)
        except Exception as exc:
            err = to_gateway_error(exc)
            if isinstance(err, InvalidRequest):
                raise _renamed(err) from None
            raise
        return json_response({"object": "response.input_tokens", "input_tokens": count})


_BUILT_FIELDS = {
    "id",
    "object",
    "created_at",
    "status",
    "completed_at",
    "error",
    "incomplete_details",
    "model",
    "output",
    "usage",
}


def _int_param(raw: str | None, name: str, lo: int, hi: int | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidRequest(f"Invalid value for '{name}': expected an integer.", param=name) from None
    if value < lo or (hi is not None and value > hi):
        raise InvalidRequest(f"Invalid value for '{name}': {value} is outside [{lo}, {hi}].", param=name)
    return value
