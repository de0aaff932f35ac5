"""The chat pipeline's streamed answer (its typed steps, gateway/protocol/events.py) -> Anthropic's stream events.

    message_start, ping, (content_block_start, content_block_delta..., content_block_stop)...,
    message_delta (stop_reason, stop_sequence, usage), message_stop

What each event makes is the Message fold's (fold.py, which builds the non-streamed Message too); this sends it.
Keep-alives are `ping` events (the response's own, PING) and a failed answer ends with an Anthropic `error` event.
"""

from __future__ import annotations

from sse_starlette import ServerSentEvent

from gateway.anthropic.errors import from_openai_body, sse_event
from gateway.anthropic.fold import AnthropicEvent, MessageFold
from gateway.anthropic.response import Shape
from gateway.errors import error_body
from gateway.protocol.events import Failed, Step

PING = sse_event("ping", {"type": "ping"})


def ping() -> ServerSentEvent:
    """The keep-alive of a Messages stream: PING, as an event (Anthropic's clients read it)."""
    return ServerSentEvent(data='{"type":"ping"}', event="ping", sep="\n")


def _wire(events: list[AnthropicEvent]) -> bytes:
    return b"".join(PING if name == "ping" else sse_event(name, data) for name, data in events)


class EventStream:
    """Feed it the chat answer's steps as they come; it returns the Anthropic events to send."""

    def __init__(self, shape: Shape, input_tokens: int, *, request_id: str) -> None:
        self.fold = MessageFold(shape, input_tokens)
        self.request_id = request_id
        self.ended = False

    def feed(self, step: Step) -> bytes:
        """The Anthropic events one step of the chat answer makes (nothing once the stream has ended)."""
        out: list[bytes] = []
        for e in step.events:
            if self.ended:
                break
            if isinstance(e, Failed):
                self.ended = True
                out.append(sse_event("error", from_openai_body(error_body(e.error), self.request_id)))
            else:
                out.append(_wire(self.fold.take(e)))
        return b"".join(out)

    def done(self) -> bytes:
        """The end of the answer (unless it failed): message_delta and message_stop."""
        if self.ended:
            return b""
        self.ended = True
        return _wire(self.fold.end())
