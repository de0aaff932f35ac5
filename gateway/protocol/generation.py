"""Consuming the engine: accumulate RequestOutput deltas, merge streams, survive disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.types import Receive

from backend.engine.outputs import CompletionDelta, RequestOutput, TokenLogprob, Usage
from gateway.errors import GatewayError

T = TypeVar("T")


class ClientDisconnected(GatewayError):
    """The client went away before the response was ready (logged as status 499)."""

    status = 499
    error_type = "client_closed_request"


def finish_reason(reason: str | None) -> str | None:
    """The engine's reasons ("stop", "length", "abort") as OpenAI's ("stop", "length")."""
    if reason is None:
        return None
    return "length" if reason == "length" else "stop"


@dataclass
class ChoiceState:
    """Everything one choice produced so far."""

    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None

    def absorb(self, delta: CompletionDelta) -> None:
        self.text.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = finish_reason(delta.finish_reason)


@dataclass
class Generation:
    """The accumulated result of one generate() call (all n choices of one prompt)."""

    choices: dict[int, ChoiceState] = field(default_factory=dict)
    usage: Usage = field(default_factory=lambda: Usage(prompt_tokens=0, completion_tokens=0))
    prompt_token_ids: tuple[int, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None

    def absorb(self, out: RequestOutput) -> None:
        self.usage = out.usage
        if out.prompt_token_ids is not None:
            self.prompt_token_ids = out.prompt_token_ids
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        for delta in out.deltas:
            state = self.choices.get(delta.index)
            if state is None:
                state = self.choices[delta.index] = ChoiceState(delta.index)
            state.absorb(delta)

    def ordered(self) -> list[ChoiceState]:
        return [self.choices[i] for i in sorted(self.choices)]


def has_tokens(out: RequestOutput) -> bool:
    return any(d.token_ids for d in out.deltas)


async def collect(stream: AsyncGenerator[RequestOutput, None], on_token: Callable[[], None]) -> Generation:
    """Drain one engine stream; closing it early (cancellation) aborts the engine request."""
    gen = Generation()
    async with aclosing(stream):
        async for out in stream:
            if has_tokens(out):
                on_token()
            gen.absorb(out)
    return gen


async def merge(streams: list[AsyncGenerator[T, None]]) -> AsyncGenerator[tuple[int, T], None]:
    """Interleave several async iterators, tagging items with their stream's index."""
    if len(streams) == 1:
        async with aclosing(streams[0]):
            async for item in streams[0]:
                yield 0, item
        return
    # (stream index, item, or the exception that ended the stream, or None when it ended cleanly)
    queue: asyncio.Queue[tuple[int, tuple[T] | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async with aclosing(stream):
                async for item in stream:
                    queue.put_nowait((i, (item,)))
            queue.put_nowait((i, None))
        except Exception as exc:
            queue.put_nowait((i, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, news = await queue.get()
            if isinstance(news, BaseException):
                raise news
            if news is None:
                remaining -= 1
            else:
                yield i, news[0]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@dataclass
class _Watch:
    watcher: asyncio.Task[None] | None = None
    disconnected: bool = False


async def unless_disconnected(receive: Receive, work: Awaitable[T], grace_s: float = 0.05) -> T:
    """Await `work` in this task; if the client disconnects, cancel it (aborting engine requests).

    Call only after the request body has been read. Work that ends within `grace_s` never
    starts the disconnect watcher, so quick requests pay for one timer, not a task.
    """
    task = asyncio.current_task()
    assert task is not None
    watch = _Watch()

    async def watch_disconnect() -> None:
        await _wait_disconnect(receive)
        watch.disconnected = True
        task.cancel()

    def start_watching() -> None:
        watch.watcher = asyncio.ensure_future(watch_disconnect())

    timer = asyncio.get_running_loop().call_later(grace_s, start_watching)
    try:
        return await work
    except asyncio.CancelledError:
        if watch.disconnected and task.uncancel() == 0:
            raise ClientDisconnected("The client closed the connection.") from None
        raise
    finally:
        timer.cancel()
        if watch.watcher is not None:
            watch.watcher.cancel()
