"""Starting engine requests: first outputs (so early errors become HTTP errors), cleanly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable
from typing import TypeVar

from backend.engine.outputs import RequestOutput
from gateway.errors import InternalError

T = TypeVar("T")


async def gather_or_cancel(aws: list[Awaitable[T]]) -> list[T]:
    """asyncio.gather, but a failure cancels the siblings (aborting their engine requests)."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _first(stream: AsyncGenerator[RequestOutput, None]) -> RequestOutput:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        raise InternalError("The engine ended the request without output.") from None


async def prime(streams: list[AsyncGenerator[RequestOutput, None]]) -> list[RequestOutput]:
    """The first output of every stream; engine errors (queue full, context length...) raise here."""
    try:
        if len(streams) == 1:
            return [await _first(streams[0])]
        return await gather_or_cancel([_first(s) for s in streams])
    except BaseException:
        for stream in streams:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        raise
