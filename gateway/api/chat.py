"""POST /v1/chat/completions: chat template -> engine -> chat.completion or SSE chunks."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from backend.engine.outputs import CompletionDelta, RequestOutput
from gateway.api.engine_io import prime
from gateway.context import GatewayContext
from gateway.ops.record import RequestRecord, record_of
from gateway.protocol.events import (
    ChatEvent,
    Failed,
    Finish,
    Opened,
    Step,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageReport,
)
from gateway.protocol.generation import Generation, collect, finish_reason, has_tokens, unless_disconnected
from gateway.protocol.jsonio import json_response, read_json
from gateway.protocol.logprobs import chat_logprobs
from gateway.protocol.requests import ChatRequest, parse_chat
from gateway.protocol.responses import chat_completion, system_fingerprint, usage_json
from gateway.protocol.sampling import with_key_priority
from gateway.protocol.sse import ChatStream, StreamLimits, chain, sse_data
from gateway.protocol.tool_output import ToolStream, with_tool_calls


@dataclass(frozen=True)
class ChunkMaker:
    """Renders the answer's events as chat.completion.chunk objects sharing one id, timestamp and model."""

    id: str
    created: int
    model: str
    include_usage: bool
    n: int = 1
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

    def render(self, step: Step) -> bytes:
        """One step's chunks, written together (the first step opens every choice with its role chunk)."""
        out = []
        for e in step.events:
            if isinstance(e, Opened):
                out += [self.role(index) for index in range(self.n)]
            elif isinstance(e, UsageReport):
                if self.include_usage:
                    out.append(self.chunk([], dict(e.usage)))
            elif not isinstance(e, Failed):
                out.append(self.chunk([_choice(e)]))
        return b"".join(out)


def _choice(e: TextDelta | ToolCallStart | ToolCallDelta | Finish) -> dict[str, Any]:
    if isinstance(e, Finish):
        return {"index": e.choice, "delta": {}, "logprobs": None, "finish_reason": e.reason}
    if isinstance(e, TextDelta):
        return {"index": e.choice, "delta": {"content": e.text}, "logprobs": e.logprobs, "finish_reason": None}
    if isinstance(e, ToolCallStart):
        call = {"index": e.call, "id": e.id, "type": "function", "function": {"name": e.name, "arguments": ""}}
    else:
        call = {"index": e.call, "function": {"arguments": e.arguments}}
    return {"index": e.choice, "delta": {"tool_calls": [call]}, "logprobs": None, "finish_reason": None}


@dataclass(frozen=True)
class DeltaEvents:
    """The engine's deltas as events: text (with chat logprobs when asked for), or content and tool calls when the
    request offered tools."""

    with_logprobs: bool
    tools: ToolStream | None = None

    def of(self, d: CompletionDelta) -> list[ChatEvent]:
        if self.tools is not None:
            return self.tools.events(d)
        out: list[ChatEvent] = []
        if d.text or (d.logprobs and self.with_logprobs):
            out.append(TextDelta(d.index, d.text, chat_logprobs(d.logprobs or ()) if self.with_logprobs else None))
        if d.finish_reason is not None:
            out.append(Finish(d.index, finish_reason(d.finish_reason) or "stop"))
        return out


async def chat_steps(
    model: str, deltas: DeltaEvents, outputs: AsyncGenerator[RequestOutput, None], rec: RequestRecord
) -> AsyncGenerator[Step, None]:
    """One step per engine output (one write), the usage last."""
    usage = None
    opened = False
    async for out in outputs:
        usage = out.usage
        rec.set_usage(usage)
        if has_tokens(out):
            rec.first_token()
        events = [event for delta in out.deltas for event in deltas.of(delta)]
        if not opened:
            events, opened = [Opened(model), *events], True
        if events:
            yield Step(tuple(events))
    if usage is not None:
        yield Step((UsageReport(usage_json(usage)),))


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
        req = parse_chat(raw, strict_params=self.ctx.config.strict_params)
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
        maker = ChunkMaker(completion_id, int(time.time()), model.id, req.stream.include_usage, req.params.n,
                           system_fingerprint(self.ctx.cache.fingerprint))
        if req.stream.stream:
            build = lambda g: self._body(maker, req, g)  # noqa: E731
            tools = ToolStream(self._call_id) if req.tools is not None else None
            deltas = DeltaEvents(req.logprobs, tools)
            return ticket.mark(await self._stream(request, maker, deltas, ticket.tap(stream, build), rec=rec))
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
        maker: ChunkMaker,
        deltas: DeltaEvents,
        stream: AsyncGenerator[RequestOutput, None],
        *,
        rec: RequestRecord,
    ) -> Response:
        (first,) = await unless_disconnected(request.receive, prime([stream]))
        steps = chat_steps(maker.model, deltas, chain(first, stream), rec)
        on_error = lambda exc, err: self.ctx.report_error(rec, exc, err)  # noqa: E731
        return ChatStream(steps, maker.render, on_error, self.ctx.config.retry_after_s, engine_streams=[stream],
                          limits=StreamLimits.of(self.ctx.config), on_disconnect=rec.client_disconnected)
