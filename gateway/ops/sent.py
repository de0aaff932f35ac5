"""What the gateway sent a client, as the API objects it serialised: the tracing middleware's content capture
(`gen_ai.output.messages`, docs/tracing.md) reads these objects, never the bytes they became.

Every place that turns an answer object into bytes calls `sent(obj)`: SSE data lines (`protocol/sse.py`,
Anthropic's and Responses' events), JSON bodies (`protocol/jsonio.py`, Messages'), and the chunks an upstream's
stream was parsed into (`routing/proxy.py`). Outside a `capturing()` block (content capture off, the default)
`sent` does nothing but read a context variable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

MAX_OBJECTS = 20_000  # a long stream's objects past this are not kept (the attribute is cut at max_content_chars)

_SENT: ContextVar[list[object] | None] = ContextVar("smolgate_sent", default=None)


@contextmanager
def capturing() -> Iterator[list[object]]:
    """Collect, in this request's context (and the tasks it starts), every answer object sent."""
    objects: list[object] = []
    token = _SENT.set(objects)
    try:
        yield objects
    finally:
        _SENT.reset(token)


def sent(obj: object) -> None:
    objects = _SENT.get()
    if objects is not None and len(objects) < MAX_OBJECTS:
        objects.append(obj)
