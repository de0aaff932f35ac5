"""Server-sent events: orjson-encoded `data:` lines, the error event, and a response that
always aborts its engine requests when it ends (finished, failed, or client gone).

ChatStream is the chat pipeline's streamed answer: typed steps (gateway/protocol/events.py) sent as chat
chunks, or taken as they are (`steps()`) by an endpoint that renders them in its own shape."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing, suppress
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Message, Receive, Scope, Send

from gateway.config import GatewayConfig
from gateway.errors import GatewayError, error_bytes, to_gateway_error
from gateway.ops.sent import sent
from gateway.protocol.events import Failed, Step, Steps

T = TypeVar("T")
DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class StreamLimits:
    ping_s: float  # keep-alive comment lines on idle streams
    send_timeout_s: float  # a client that reads nothing this long loses its stream (its engine requests abort)
    drain_s: float  # on shutdown, a running stream gets this long to finish before it is cut

    @classmethod
    def of(cls, cfg: GatewayConfig) -> StreamLimits:
        return cls(cfg.sse_ping_s, cfg.stream_send_timeout_s, cfg.drain_timeout_s)


def sse_data(obj: Any) -> bytes:
    sent(obj)
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_error(err: GatewayError) -> bytes:
    """An `error` event carrying an OpenAI error body; the OpenAI SDK raises APIError on it."""
    return b"event: error\ndata: " + error_bytes(err) + b"\n\n"


async def chain(first: T, rest: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """`first`, then the rest of the stream; closing the chain closes the stream (an abort)."""
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await _close(rest)


async def guarded(
    events: AsyncGenerator[bytes, None], on_error: Callable[[BaseException, GatewayError], None], retry_after_s: int
) -> AsyncGenerator[bytes, None]:
    """Pass events through and end with [DONE]; an exception becomes one error event, then the end."""
    async with aclosing(events):
        try:
            async for event in events:
                yield event
        except Exception as exc:
            err = to_gateway_error(exc, retry_after_s=retry_after_s)
            on_error(exc, err)
            yield sse_error(err)
            return
    yield DONE


class SSEStream(EventSourceResponse):
    """An EventSourceResponse that closes its generators (aborting engine requests) when done."""

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        engine_streams: Sequence[AsyncIterator[Any]],
        limits: StreamLimits,
        on_disconnect: Callable[[], None],
        *,
        ping: Callable[[], ServerSentEvent] | None = None,
    ) -> None:
        """`ping`: the keep-alive event (a comment line when None)."""
        self._complete = False

        async def client_closed(message: Message) -> None:
            if not self._complete:  # uvicorn also reports "disconnect" once a response is complete
                on_disconnect()

        self._events = self._until_complete(events)
        self._engine_streams = engine_streams
        super().__init__(
            self._events,
            ping=limits.ping_s,
            ping_message_factory=ping,
            sep="\n",
            client_close_handler_callable=client_closed,
            send_timeout=limits.send_timeout_s,
            # sse-starlette ends streams as soon as uvicorn is asked to exit; give them the drain time instead
            shutdown_grace_period=limits.drain_s,
        )

    async def _until_complete(self, events: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
        async with aclosing(events):
            async for event in events:
                yield event
        self._complete = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _close(self._events)
            for stream in self._engine_streams:
                await _close(stream)


async def guarded_steps(
    steps: AsyncIterator[Step], on_error: Callable[[BaseException, GatewayError], None], retry_after_s: int
) -> AsyncIterator[Step]:
    """Pass steps through; an exception becomes one Failed step, then the end."""
    async with aclosing(steps):  # type: ignore[type-var]
        try:
            async for step in steps:
                yield step
        except Exception as exc:
            err = to_gateway_error(exc, retry_after_s=retry_after_s)
            on_error(exc, err)
            yield Step((Failed(err),))


async def chat_wire(steps: Steps, render: Callable[[Step], bytes]) -> AsyncGenerator[bytes, None]:
    """Steps as chat chunks (a step's own `wire` bytes when it has them), then [DONE]; Failed: the error event."""
    async with aclosing(steps):
        async for step in steps:
            failed = next((e for e in step.events if isinstance(e, Failed)), None)
            if failed is not None:
                yield sse_error(failed.error)
                return
            data = step.wire if step.wire is not None else render(step)
            if data:
                yield data
    yield DONE


class ChatStream(SSEStream):
    """The chat pipeline's streamed answer. Sent, it is chat chunks; `steps()` hands its typed steps to an
    endpoint that renders them itself (/v1/responses, /v1/messages), which then sends its own response."""

    def __init__(
        self,
        steps: AsyncIterator[Step],
        render: Callable[[Step], bytes],
        on_error: Callable[[BaseException, GatewayError], None],
        retry_after_s: int,
        *,
        engine_streams: Sequence[AsyncIterator[Any]],
        limits: StreamLimits,
        on_disconnect: Callable[[], None],
    ) -> None:
        async def close_engine() -> None:
            for stream in engine_streams:
                await _close(stream)

        self._steps = Steps(guarded_steps(steps, on_error, retry_after_s), close_engine)
        super().__init__(chat_wire(self._steps, render), engine_streams, limits, on_disconnect)

    def steps(self) -> Steps:
        """The answer's steps (the caller closes them: that aborts what is still running)."""
        return self._steps


async def _close(stream: AsyncIterator[Any]) -> None:
    aclose = getattr(stream, "aclose", None)
    if aclose is not None:
        with suppress(RuntimeError):  # already running elsewhere: its owner closes it
            await aclose()
