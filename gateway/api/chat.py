"""POST /v1/chat/completions: chat template -> engine -> chat.completion or SSE chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from backend.engine.outputs import CompletionDelta, RequestOutput
from gateway.api.engine_io import prime
from gateway.context import GatewayContext
from gateway.ops.record import RequestRecord, record_of
from gateway.protocol.generation import Generation, collect, finish_reason, has_tokens, unless_disconnected
from gateway.protocol.jsonio import json_response, read_json
from gateway.protocol.logprobs import chat_logprobs
from gateway.protocol.requests import ChatRequest, parse_chat
from gateway.protocol.responses import chat_completion, system_fingerprint, usage_json
from gateway.protocol.sampling import with_key_priority
from gateway.protocol.sse import SSEStream, StreamLimits, chain, guarded, sse_data
from gateway.protocol.tool_output import ToolStream, with_tool_calls


@dataclass(frozen=True)
class ChunkMaker:
    """Builds chat.completion.chunk objects sharing one id, timestamp and model."""

    id: str
    created: int
    model: str
    include_usage: bool
    with_logprobs: bool
    tools: ToolStream | None = None  # set when the text may hold tool calls
    system_fingerprint: str | None = None

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> bytes:
        obj: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.system_fingerprint is not None:
            obj["system_fingerprint"] = self.system_fingerprint
        if self.include_usage:
            obj["usage"] = usage
        return sse_data(obj)

    def role(self, index: int) -> bytes:
        delta = {"role": "assistant", "content": "", "refusal": None}
        return self.chunk([{"index": index, "delta": delta, "logprobs": None, "finish_reason": None}])

    def deltas(self, d: CompletionDelta) -> list[bytes]:
        if self.tools is not None:
            return [self.chunk([choice]) for choice in self.tools.choices(d)]
        out = []
        if d.text or (d.logprobs and self.with_logprobs):
            logprobs = chat_logprobs(d.logprobs or ()) if self.with_logprobs else None
            choice = {
                "index": d.index,
                "delta": {"content": d.text},
                "logprobs": logprobs,
                "finish_reason": None,
            }
            out.append(self.chunk([choice]))
        if d.finish_reason is not None:
            reason = finish_reason(d.finish_reason)
            out.append(self.chunk([{"index": d.index, "delta": {}, "logprobs": None, "finish_reason": reason}]))
        return out


async def chat_events(
    maker: ChunkMaker, n: int, outputs: AsyncIterator[RequestOutput], rec: RequestRecord
) -> AsyncIterator[bytes]:
    """One write per engine step: all chunks an output produces are sent together."""
    roles = [maker.role(index) for index in range(n)]
    usage = None
    async for out in outputs:
        usage = out.usage
        rec.set_usage(usage)
        if has_tokens(out):
            rec.first_token()
        events = [event for delta in out.deltas for event in maker.deltas(delta)]
        if roles:
            events, roles = roles + events, []
        if events:
            yield b"".join(events)
    if maker.include_usage and usage is not None:
        yield maker.chunk([], usage_json(usage))


class ChatCompletions:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def handle(self, request: Request, raw: dict[str, Any] | None = None) -> Response:
        """`raw`: the body, when the router has read it already (a deployment of kind embedded)."""
        rec = record_of(request)
        raw = raw if raw is not None else await read_json(request, self.ctx.config.max_body_bytes)
        defaults = self.ctx.config.sampling_defaults
        if defaults:  # before the cache's key: a default is part of what the request asks for
            raw = {**raw, **{k: v for k, v in defaults.items() if raw.get(k) is None}}
        ticket = self.ctx.cache.ticket("chat", request.headers, raw)  # takes the `cache` extension out
        req = parse_chat(raw)
        req = replace(req, params=with_key_priority(req.params, raw, rec.policy))
        model = self.ctx.catalog.resolve(req.model, "chat")
        rec.model, rec.stream = model.id, req.stream.stream
        rec.user = req.user
        prompt = self.ctx.engine.apply_chat_template(req.messages, continue_final_message=req.continue_final)
        cached = await ticket.lookup(rec, raw, req.params, req.stream, messages=req.messages, prompt_ids=prompt)
        if cached is not None:
            return cached
        completion_id = f"chatcmpl-{self.ctx.ids.new()}"
        # A near-miss cached answer is never served, but the engine may copy drafts from it (verified).
        near = await ticket.near_miss_answer()
        params = req.params if near is None else replace(req.params, spec_reference=near)
        if ticket.records_answer and params.logprobs is None:  # kept with the entry for the cache's verifier
            params = replace(params, logprobs=0)
        stream = self.ctx.engine.generate(prompt, params, completion_id)
        tools = ToolStream(self._call_id) if req.tools is not None else None
        maker = ChunkMaker(completion_id, int(time.time()), model.id, req.stream.include_usage, req.logprobs, tools,
                           system_fingerprint(self.ctx.cache.fingerprint))
        if req.stream.stream:
            build = lambda g: self._body(maker, req, g)  # noqa: E731
            return ticket.mark(await self._stream(request, req, maker, ticket.tap(stream, build), rec=rec))
        gen: Generation = await unless_disconnected(request.receive, collect(stream, rec.first_token))
        rec.set_usage(gen.usage)
        body = self._body(maker, req, gen)
        await ticket.store(body, gen)
        return ticket.mark(json_response(body))

    def _body(self, maker: ChunkMaker, req: ChatRequest, gen: Generation) -> dict[str, Any]:
        body = chat_completion(maker.id, maker.created, maker.model, gen.ordered(), usage=gen.usage, with_logprobs=req.logprobs,
                               system_fingerprint=maker.system_fingerprint)
        return body if req.tools is None else with_tool_calls(body, self._call_id)

    def _call_id(self) -> str:
        return f"call_{self.ctx.ids.new()[-24:]}"

    async def _stream(
        self,
        request: Request,
        req: ChatRequest,
        maker: ChunkMaker,
        stream: AsyncIterator[RequestOutput],
        *,
        rec: RequestRecord,
    ) -> Response:
        (first,) = await unless_disconnected(request.receive, prime([stream]))
        events = chat_events(maker, req.params.n, chain(first, stream), rec)
        safe = guarded(events, lambda exc, err: self.ctx.report_error(rec, exc, err), self.ctx.config.retry_after_s)
        return SSEStream(safe, [stream], StreamLimits.of(self.ctx.config), rec.client_disconnected)
