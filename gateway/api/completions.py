"""POST /v1/completions: prompt strings or token ids (several at once), echo, int logprobs."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from backend.engine.outputs import CompletionDelta, RequestOutput, TokenLogprob, Usage
from gateway.api.engine_io import gather_or_cancel, prime
from gateway.client import EngineClient
from gateway.context import GatewayContext
from gateway.ops.record import RequestRecord, record_of
from gateway.protocol.generation import ChoiceState, collect, finish_reason, has_tokens, merge, unless_disconnected
from gateway.protocol.jsonio import json_response, read_json
from gateway.protocol.logprobs import completion_logprobs, generated_items
from gateway.protocol.requests import CompletionRequest, Prompt, parse_completion
from gateway.protocol.responses import add_usage, system_fingerprint, text_completion, usage_json
from gateway.protocol.sampling import with_key_priority
from gateway.protocol.sse import SSEStream, StreamLimits, chain, guarded, sse_data

LogprobItems = list[tuple[str, TokenLogprob | None]]


@dataclass(frozen=True)
class Echo:
    """The prompt as echoed back: its text and, when logprobs are asked for, its token logprobs."""

    text: str
    items: LogprobItems


def make_echo(
    engine: EngineClient,
    prompt: Prompt,
    ids: Sequence[int],
    logprobs: Sequence[TokenLogprob | None] | None,
    *,
    want_logprobs: bool,
) -> Echo:
    """The echoed prompt; token ids come from the engine's first output, else from tokenizing."""
    text = prompt if isinstance(prompt, str) else engine.detokenize(list(prompt))
    if not want_logprobs:
        return Echo(text, [])
    ids = ids or (engine.tokenize(prompt) if isinstance(prompt, str) else prompt)
    lps = list(logprobs or ())
    lps += [None] * (len(ids) - len(lps))  # the first prompt token never has one
    items = [(lp.token if lp else engine.detokenize([tid]), lp) for tid, lp in zip(ids, lps, strict=False)]
    return Echo(text, items)


def completion_choice(index: int, state: ChoiceState, echo: Echo | None, want_logprobs: bool) -> dict[str, Any]:
    logprobs = None
    if want_logprobs:
        logprobs = completion_logprobs((echo.items if echo else []) + generated_items(state.logprobs))
    return {
        "index": index,
        "text": (echo.text if echo else "") + "".join(state.text),
        "logprobs": logprobs,
        "finish_reason": state.finish_reason or "stop",
    }


@dataclass
class CompletionChunks:
    """Builds streamed text_completion chunks; remembers per-choice echo and text offsets."""

    id: str
    created: int
    model: str
    n: int
    include_usage: bool
    want_logprobs: bool
    echoes: list[Echo | None]
    offsets: dict[int, int] = field(default_factory=dict)
    system_fingerprint: str | None = None

    def chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> bytes:
        obj: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": choices,
        }  # fmt: skip
        if self.system_fingerprint is not None:
            obj["system_fingerprint"] = self.system_fingerprint
        if usage is not None:
            obj["usage"] = usage_json(usage)
        return sse_data(obj)

    def delta(self, prompt_index: int, d: CompletionDelta) -> bytes | None:
        index = prompt_index * self.n + d.index
        echo = self.echoes[prompt_index] if index not in self.offsets else None
        text = (echo.text if echo else "") + d.text
        items = (echo.items if echo else []) + generated_items(d.logprobs or ())
        if not text and not items and d.finish_reason is None:
            return None
        offset = self.offsets.get(index, 0)
        self.offsets[index] = offset + len(text)
        logprobs = completion_logprobs(items, offset) if self.want_logprobs else None
        reason = finish_reason(d.finish_reason)
        return self.chunk([{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}])


async def completion_events(
    chunks: CompletionChunks, outputs: AsyncGenerator[tuple[int, RequestOutput], None], rec: RequestRecord
) -> AsyncGenerator[bytes, None]:
    usages: dict[int, Usage] = {}
    async for prompt_index, out in outputs:
        usages[prompt_index] = out.usage
        rec.set_usage(_total(usages.values()))
        if has_tokens(out):
            rec.first_token()
        events = [e for e in (chunks.delta(prompt_index, d) for d in out.deltas) if e is not None]
        if events:
            yield b"".join(events)
    if chunks.include_usage:
        yield chunks.chunk([], _total(usages.values()))


def _total(usages: Any) -> Usage:
    return reduce(add_usage, usages, Usage(prompt_tokens=0, completion_tokens=0))


class Completions:
    def __init__(self, ctx: GatewayContext) -> None:
        self.ctx = ctx

    async def handle(self, request: Request, raw: dict[str, Any] | None = None) -> Response:
        """`raw`: the body, when the router has read it already (a deployment of kind embedded)."""
        rec = record_of(request)
        raw = raw if raw is not None else await read_json(request, self.ctx.config.max_body_bytes)
        ticket = self.ctx.cache.ticket("completions", request.headers, raw)  # takes the `cache` extension out
        req = parse_completion(raw, strict_params=self.ctx.config.strict_params)
        req = replace(req, params=with_key_priority(req.params, raw, rec.policy))
        model = self.ctx.catalog.resolve(req.model, "chat")
        rec.model, rec.stream = model.id, req.stream.stream
        rec.user = req.user
        cached = await ticket.lookup(rec, raw, req.params, req.stream, prompt=req.prompts)
        if cached is not None:
            return cached
        completion_id = f"cmpl-{self.ctx.ids.new()}"
        fingerprint = system_fingerprint(self.ctx.cache.fingerprint)
        streams = [self.ctx.engine.generate(p, req.params, f"{completion_id}-{i}") for i, p in enumerate(req.prompts)]
        if req.stream.stream:
            if len(streams) == 1 and not req.echo:  # stored from the stream: one prompt, nothing echoed
                want = req.params.logprobs is not None
                streams = [ticket.tap(streams[0], lambda g: text_completion(
                    completion_id, int(time.time()), model.id, [completion_choice(c.index, c, None, want) for c in g.ordered()],
                    usage=g.usage, system_fingerprint=fingerprint))]  # fmt: skip
            return ticket.mark(await self._stream(request, req, completion_id, model.id, streams=streams, rec=rec))
        gens = await unless_disconnected(request.receive, gather_or_cancel([collect(s, rec.first_token) for s in streams]))
        usage = _total(g.usage for g in gens)
        rec.set_usage(usage)
        want = req.params.logprobs is not None
        choices = []
        for i, (prompt, gen) in enumerate(zip(req.prompts, gens, strict=True)):
            echo = self._echo(req, prompt, gen.prompt_token_ids, gen.prompt_logprobs)
            for state in gen.ordered():
                choices.append(completion_choice(i * req.params.n + state.index, state, echo, want))
        body = text_completion(completion_id, int(time.time()), model.id, choices, usage=usage, system_fingerprint=fingerprint)
        await ticket.store(body)
        return ticket.mark(json_response(body))

    def _echo(
        self,
        req: CompletionRequest,
        prompt: Prompt,
        ids: Sequence[int],
        logprobs: Sequence[TokenLogprob | None] | None,
    ) -> Echo | None:
        if not req.echo:
            return None
        return make_echo(self.ctx.engine, prompt, ids, logprobs, want_logprobs=req.params.logprobs is not None)

    async def _stream(
        self,
        request: Request,
        req: CompletionRequest,
        completion_id: str,
        model: str,
        *,
        streams: list[AsyncGenerator[RequestOutput, None]],
        rec: RequestRecord,
    ) -> Response:
        firsts = await unless_disconnected(request.receive, prime(streams))
        echoes = [
            self._echo(req, p, f.prompt_token_ids or (), f.prompt_logprobs) for p, f in zip(req.prompts, firsts, strict=True)
        ]
        chunks = CompletionChunks(
            completion_id,
            int(time.time()),
            model,
            req.params.n,
            req.stream.include_usage,
            req.params.logprobs is not None,
            echoes,
            system_fingerprint=system_fingerprint(self.ctx.cache.fingerprint),
        )
        merged = merge([chain(f, s) for f, s in zip(firsts, streams, strict=True)])
        events = completion_events(chunks, merged, rec)
        safe = guarded(events, lambda exc, err: self.ctx.report_error(rec, exc, err), self.ctx.config.retry_after_s)
        return SSEStream(safe, streams, StreamLimits.of(self.ctx.config), rec.client_disconnected)
