"""POST /v1/messages and /v1/messages/count_tokens.

A Messages request is translated (request.py) and handed to the chat handler — the embedded pipeline
or the router, whichever serves /v1/chat/completions — as a sub-request carrying the chat body (same
scope: same request record, API key, cache headers). So keys, model allow-lists, rpm/tpm, priorities,
the response cache (per-key namespace, replay), routing, metrics and the access log are the chat
endpoint's, with no second pipeline. What the chat handler sends is rewritten on its way out (Relay):
a chat.completion into a Message, chunks into Anthropic events; failures become Anthropic errors.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from gateway.anthropic import response as out
from gateway.anthropic.errors import error_body, error_response, from_openai_body, status_of
from gateway.anthropic.request import translate, translate_count
from gateway.anthropic.stream import EventStream
from gateway.client import NoEngine
from gateway.context import GatewayContext
from gateway.errors import GatewayError, InvalidRequest, ModelNotFound, to_gateway_error
from gateway.ops.record import RequestRecord, record_of
from gateway.protocol.jsonio import read_json
from gateway.protocol.requests import parse_chat
from gateway.routing.token_count import load_counter, prompt_tokens

if TYPE_CHECKING:
    from gateway.routing.router import Router

Handler = Callable[[Request], Awaitable[Any]]


def sub_request(request: Request, body: dict[str, Any]) -> Request:
    """The same request (scope, headers, record) with `body` in place of the one already read."""
    payload = orjson.dumps(body)
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        return await request.receive()  # after the body: the client's disconnect, as the pipeline expects

    return Request(request.scope, receive)


class Relay:
    """Runs the chat handler's response (JSON, SSE, or the router's tracked response), rewriting it."""

    def __init__(
        self,
        inner: Any,
        stream: EventStream | None,
        to_message: Callable[[dict[str, Any]], dict[str, Any]],
        rec: RequestRecord,
        *,
        headers: list[tuple[bytes, bytes]] | None = None,  # added to the response's (what was left out...)
    ):
        self.inner, self.stream, self.to_message, self.rec = inner, stream, to_message, rec
        self.extra = headers or []
        self.headers = inner.headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        extra = [(b"request-id", self.rec.request_id.encode()), *self.extra]
        start: Message = {}
        chunks: list[bytes] = []
        stream = self.stream

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = {**message, "headers": [*message.get("headers", ()), *extra]}
                if stream is not None:
                    await send(start)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            more = message.get("more_body", False)
            if stream is not None:
                data = stream.feed(message.get("body", b""))
                if data or not more:
                    await send({"type": "http.response.body", "body": data, "more_body": more})
                return
            chunks.append(message.get("body", b""))
            if not more:
                status, body = self._json(start.get("status", 200), b"".join(chunks))
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                await send({**start, "status": status, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})

        await self.inner(scope, receive, rewrite)

    def _json(self, status: int, raw: bytes) -> tuple[int, bytes]:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if status != 200:
            return status, orjson.dumps(from_openai_body(body, self.rec.request_id))
        try:
            if not isinstance(body, dict):
                raise out.BadUpstreamShape("The model's answer came back in an unexpected shape.")
            return 200, orjson.dumps(self.to_message(body))
        except GatewayError as err:
            self.rec.error_type = err.error_type
            return status_of(err), orjson.dumps(error_body(err, self.rec.request_id))


class Messages:
    def __init__(self, ctx: GatewayContext, chat: Handler, router: Router | None = None) -> None:
        self.ctx = ctx
        self.chat = chat
        self.router = router
        self._estimate: Callable[[str], int] | None = None

    async def create(self, request: Request) -> Response:
        rec = record_of(request)
        try:
            raw = await read_json(request, self.ctx.config.max_body_bytes)
            req = translate(raw, self.ctx.config.strict_params)
            if req.prefill and self.router is not None:  # continue_final_message is vLLM's, not OpenAI's
                raise InvalidRequest(
                    "A final assistant message (prefill) is continued by the embedded engine only, not through the router.",
                    param=f"messages[{len(raw['messages']) - 1}]",
                )
            message_id = f"msg_{self.ctx.ids.new()}"
            chat, window, stops = req.chat, False, req.stop_sequences
            if self.router is not None and "include_stop_str_in_output" in chat:
                # a vLLM extension an OpenAI upstream would refuse: upstream, a stop sequence ends the text unnamed
                chat, stops = {k: v for k, v in chat.items() if k != "include_stop_str_in_output"}, ()
            embedded = self.router is None and not isinstance(self.ctx.engine, NoEngine)
            prompt = self._prompt_tokens(chat) if req.stream or embedded else 0
            room = self.ctx.engine.max_model_len - prompt if embedded else 0
            if embedded and room <= 0:  # Anthropic's own words, which Claude Code recognises
                raise InvalidRequest(f"prompt is too long: {prompt} tokens > {self.ctx.engine.max_model_len} maximum")
            if 0 < room < chat["max_tokens"]:
                # Anthropic's max_tokens is a cap that clients set high (thousands): like Anthropic's newer
                # models, generate up to the context window and say so (model_context_window_exceeded)
                chat, window = {**chat, "max_tokens": room}, True
            cap = (rec.policy if rec.policy is not None else self.ctx.guard.anonymous).max_tokens
            if cap and chat["max_tokens"] > cap:  # a cap too, then the key's (Claude Code asks for 32,000 or more)
                chat, window = {**chat, "max_tokens": cap}, False
            stream = None
            if req.stream:  # message_start carries the prompt's size; message_delta the engine's own count
                stream = EventStream(message_id, req.model, prompt, stops, request_id=rec.request_id, window=window)
            inner = await self.chat(sub_request(request, chat))
        except Exception as exc:
            return self._error(rec, exc)
        to_message = lambda body: out.message(body, message_id, req.model, stops, window=window)  # noqa: E731
        notes = [(b"smolgate-tools-left-out", ",".join(req.left_out).encode())] if req.left_out else []
        return Relay(inner, stream, to_message, rec, headers=notes)  # type: ignore[return-value]

    async def count_tokens(self, request: Request) -> Response:
        rec = record_of(request)
        try:
            raw = await read_json(request, self.ctx.config.max_body_bytes)
            model, chat = translate_count(raw, self.ctx.config.strict_params)
            rec.model = self._resolve(request, model)
            count = self._prompt_tokens(chat)
        except Exception as exc:
            return self._error(rec, exc)
        return Response(
            orjson.dumps({"input_tokens": count}), media_type="application/json", headers={"request-id": rec.request_id}
        )

    def _error(self, rec: RequestRecord, exc: Exception) -> Response:
        err = to_gateway_error(exc, retry_after_s=self.ctx.config.retry_after_s)
        self.ctx.report_error(rec, exc, err)
        return error_response(err, rec.request_id)

    def _resolve(self, request: Request, model: str) -> str:
        """The served model, as the chat endpoint would pick it (aliases, the key's allowed models)."""
        rec = record_of(request)
        policy = rec.policy if rec.policy is not None else self.ctx.guard.anonymous
        router = self.router
        if router is None:
            name = self.ctx.catalog.resolve(model, "chat").id
            allowed = self.ctx.guard.allows(policy, name, self.ctx.catalog.canonical)
        else:
            name = router.aliases.get(model, model)
            known = name in router.balancers or (model == "auto" and router.auto_enabled)
            allowed = known and router.guard.allows(policy, name, lambda n: router.aliases.get(n, n))
        if not allowed:
            raise ModelNotFound(f"The model `{model}` does not exist or you do not have access to it.", param="model")
        return name

    def _prompt_tokens(self, chat: dict[str, Any]) -> int:
        """The prompt's tokens: exact with the embedded engine (its chat template and tokenizer, the
        tool prompt included), else estimated like the router's usage counts."""
        req = parse_chat({k: v for k, v in chat.items() if k not in ("cache", "stream", "stream_options")})
        if not isinstance(self.ctx.engine, NoEngine):  # the engine of the model asked for (the `models:` list's own)
            engine = self.ctx.engine_for(chat.get("model"))
            return len(engine.apply_chat_template(req.messages, continue_final_message=req.continue_final))
        if self._estimate is None:
            self._estimate = self.router.count if self.router is not None else load_counter("")
        return prompt_tokens(self._estimate, {"messages": req.messages})
