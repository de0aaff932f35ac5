"""POST /v1/messages and /v1/messages/count_tokens.

A Messages request is translated (request.py) and its chat body handed to the chat handler — the embedded
pipeline or the router, whichever serves /v1/chat/completions — with the same request (same record, API key,
cache headers), as /v1/responses does. So keys, model allow-lists, rpm/tpm, priorities, the response cache
(per-key namespace, replay), routing, metrics and the access log are the chat endpoint's, with no second
pipeline. The chat answer's events (gateway/protocol/events.py) are folded into a Message (fold.py): a streamed
answer's steps as they come, sent as Anthropic events (stream.py), a whole one (gateway/protocol/answer.py's
ChatAnswer) at once; failures become Anthropic errors.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.anthropic.errors import error_response, from_openai_body
from gateway.anthropic.fold import message
from gateway.anthropic.request import translate, translate_count
from gateway.anthropic.response import Shape
from gateway.anthropic.stream import EventStream, ping
from gateway.client import NoEngine
from gateway.context import GatewayContext
from gateway.errors import InvalidRequest, ModelNotFound, to_gateway_error
from gateway.ops.record import RequestRecord, record_of
from gateway.ops.sent import sent
from gateway.protocol.answer import UNEXPECTED, BadUpstreamShape, InnerError, run_json
from gateway.protocol.events import Steps, steps_of
from gateway.protocol.jsonio import read_json
from gateway.protocol.requests import parse_chat
from gateway.protocol.sse import SSEStream, StreamLimits
from gateway.routing.token_count import load_counter, prompt_tokens

if TYPE_CHECKING:
    from gateway.routing.router import Router

Handler = Callable[[Request, dict[str, Any]], Awaitable[Response]]
_BODY_HEADERS = {"content-length", "content-type", "cache-control", "connection", "x-accel-buffering", "transfer-encoding"}


def _passed(headers: Mapping[str, str]) -> dict[str, str]:
    """The chat answer's own headers (x-cache, x-smolgate-...), not those that describe its body."""
    return {k: v for k, v in headers.items() if k.lower() not in _BODY_HEADERS}


async def _anthropic(events: EventStream, steps: Steps) -> AsyncGenerator[bytes, None]:
    """The chat answer's steps as Anthropic events, one write per step."""
    async with aclosing(steps):
        async for step in steps:
            data = events.feed(step)
            if data:
                yield data
    end = events.done()
    if end:
        yield end


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
            notes = {"smolgate-tools-left-out": ",".join(req.left_out)} if req.left_out else {}
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
            inner = await self.chat(request, chat)
            shape = Shape(message_id, req.model, stops, window)
            if not req.stream:
                return await self._message(request, inner, shape, notes)
            steps = steps_of(inner)
        except InnerError as exc:  # the chat pipeline answered with an error body: its status, in Anthropic's shape
            body = orjson.dumps(from_openai_body(exc.body, rec.request_id))
            return Response(body, exc.answer_status, {"request-id": rec.request_id}, media_type="application/json")
        except Exception as exc:
            return self._error(rec, exc)
        # message_start carries the prompt's size; message_delta the engine's own count
        events = EventStream(shape, prompt, request_id=rec.request_id)
        response = SSEStream(_anthropic(events, steps), [steps], StreamLimits.of(self.ctx.config), rec.client_disconnected,
                             ping=ping)
        response.headers.update({**_passed(inner.headers), "request-id": rec.request_id, **notes})
        return response

    async def _message(self, request: Request, inner: Response, shape: Shape, notes: dict[str, str]) -> Response:
        """The chat answer, run to its end in process, as a Message."""
        rec = record_of(request)
        try:
            captured, answer = await run_json(inner, request.scope)
        except InnerError as exc:
            if exc.answer_status != 200:
                raise
            raise BadUpstreamShape(UNEXPECTED) from None
        whole = message(answer, shape)
        headers = {**_passed(captured.headers), "request-id": rec.request_id, **notes}
        sent(whole)
        return Response(orjson.dumps(whole), media_type="application/json", headers=headers)

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
