"""TracedEngine: the embedded engine, whose generations in a traced request get spans — the engine's work (from
submission to the last token), and its queue wait, prefill and decode as children.

The engine runs on its own thread and knows nothing of tracing: it reports when each request was scheduled, got its
first token and finished (backend/engine/outputs.py's RequestTimings, in its finished output), and the spans are
built here from those readings once the request is over. That keeps OpenTelemetry (and context propagation across
the loop thread's inbox) out of the engine's step loop, and costs an untraced request nothing.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncGenerator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from backend.engine.outputs import RequestOutput, RequestTimings, Usage
from backend.engine.sampling_params import SamplingParams
from gateway.client import EngineClient
from gateway.tracing import genai
from gateway.tracing.otel import Tracing, epoch_clock
from gateway.tracing.spans import tracer


class TracedEngine:
    """An EngineClient that wraps one; everything but `generate` is the wrapped engine's."""

    def __init__(self, engine: EngineClient, tracing: Tracing) -> None:
        self.inner = engine  # not `engine`: AsyncEngine has an attribute of that name (its LLMEngine)
        self.tracing = tracing
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len

    def __getattr__(self, name: str) -> Any:  # tokenize, stats, output_identity, submit...
        return getattr(self.inner, name)

    def generate(self, prompt: str | list[int], params: SamplingParams, request_id: str) -> AsyncGenerator[RequestOutput, None]:
        stream = self.inner.generate(prompt, params, request_id)
        if tracer() is None:  # not a traced request (tracing off for it, or a batch line)
            return stream
        # the parent is the span current now (the request's, a router attempt's, the cache lookup's)
        return self._traced(stream, otel_context.get_current(), time.monotonic(), params)

    async def _traced(
        self, stream: AsyncGenerator[RequestOutput, None], parent: otel_context.Context, submitted: float, params: SamplingParams
    ) -> AsyncGenerator[RequestOutput, None]:
        last: RequestOutput | None = None
        error: str | None = None
        try:
            async for out in stream:
                last = out
                yield out
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()  # stopping early aborts the engine request, as without tracing
            finished = last is not None and last.finished
            spans = functools.partial(
                self._spans, parent, submitted, params, last.usage if last else None,
                timings=last.timings if last else None, error=error or (None if finished else "cancelled"),
            )  # fmt: skip
            # built once the task yields: a non-streamed answer is sent first (it is waiting on this generator)
            asyncio.get_running_loop().call_soon(spans)

    def _spans(
        self, parent: otel_context.Context, submitted: float, params: SamplingParams, usage: Usage | None,
        *, timings: RequestTimings | None, error: str | None,
    ) -> None:
        if not trace.get_current_span(parent).get_span_context().trace_flags.sampled:  # (the parent may have ended)
            return
        end = timings.finished if timings is not None else time.monotonic()
        epoch_ns = epoch_clock()
        attrs = {
            "gen_ai.provider.name": genai.PROVIDER,
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.max_tokens": params.max_tokens,
            "gen_ai.request.temperature": params.temperature,
            "gen_ai.request.top_p": params.top_p,
            "gen_ai.request.seed": params.seed,
            "gen_ai.request.choice.count": params.n if params.n != 1 else None,
            "gen_ai.usage.input_tokens": usage.prompt_tokens if usage else None,
            "gen_ai.usage.output_tokens": usage.completion_tokens if usage else None,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens if usage and usage.cached_tokens else None,
            "smolgate.engine.preemptions": timings.preemptions if timings else None,
        }
        span = self.tracing.span(f"engine {self.model_name}", "internal", attrs, parent, start_ns=epoch_ns(submitted))
        if error is not None:
            span.fail(error)
        if timings is not None:
            under = span.context()
            steps = (("engine.queue", min(submitted, timings.arrival), timings.scheduled),
                     ("engine.prefill", timings.scheduled, timings.first_token),
                     ("engine.decode", timings.first_token, timings.finished))  # fmt: skip
            for i, (name, start, stop) in enumerate(steps):
                if start is None:
                    break
                # a step it never finished ends with the request (e.g. stopped while still waiting)
                stop = stop if stop is not None else timings.finished
                child = self.tracing.span(name, "internal", None, under, start_ns=epoch_ns(start))
                if i == 2 and usage is not None:
                    child.set("gen_ai.usage.output_tokens", usage.completion_tokens)
                child.end(epoch_ns(stop))
            if timings.first_token is not None:
                ttft = timings.first_token - submitted
                span.event("gen_ai.first_token", {"gen_ai.response.time_to_first_chunk": ttft}, epoch_ns(timings.first_token))
        span.end(epoch_ns(end))
