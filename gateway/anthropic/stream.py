"""The chat pipeline's streamed answer (its typed steps, gateway/protocol/events.py) -> Anthropic's stream events.

    message_start, ping, (content_block_start, content_block_delta..., content_block_stop)...,
    message_delta (stop_reason, stop_sequence, usage), message_stop

Text becomes a `text` block of `text_delta`s; each tool call a `tool_use` block whose arguments arrive
as `input_json_delta` fragments. Keep-alives are `ping` events (the response's own, PING) and a failed
answer ends with an Anthropic `error` event. With stop_sequences, text that may be the start of one is
held back until it is known not to be (the one that ended the answer is never sent), so the text
deltas add up to exactly the non-streamed answer's text.
"""

from __future__ import annotations

from typing import Any

from sse_starlette import ServerSentEvent

from gateway.anthropic.errors import from_openai_body, sse_event
from gateway.anthropic.response import split_stop, stop_reason, tool_use_id, usage
from gateway.errors import error_body
from gateway.protocol.events import ChatEvent, Failed, Opened, Step, TextDelta, ToolCallDelta, ToolCallStart, UsageReport

PING = sse_event("ping", {"type": "ping"})


def ping() -> ServerSentEvent:
    """The keep-alive of a Messages stream: PING, as an event (Anthropic's clients read it)."""
    return ServerSentEvent(data='{"type":"ping"}', event="ping", sep="\n")


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin (or be) a stop sequence."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop), len(text)), best, -1):
            if stop.startswith(text[-k:]):
                best = k
                break
    return best


class EventStream:
    """Feed it the chat answer's steps as they come; it returns the Anthropic events to send."""

    def __init__(
        self, message_id: str, model: str, input_tokens: int, stops: tuple[str, ...], *, request_id: str, window: bool = False
    ) -> None:
        self.window = window
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.stops = stops
        self.request_id = request_id
        self.started = False
        self.ended = False
        self.block = -1  # the index of the last block opened
        self.open = False  # whether that block still is
        self.kind = ""  # its type: text | tool_use
        self.calls: dict[int, int] = {}  # chat tool-call index -> block index
        self.pending = ""  # text held back: it may begin a stop sequence
        self.finish: str | None = None
        self.stop: str | None = None
        self.usage: dict[str, Any] | None = None

    def feed(self, step: Step) -> bytes:
        """The Anthropic events one step of the chat answer makes (nothing once the stream has ended)."""
        out: list[bytes] = []
        for e in step.events:
            if self.ended:
                break
            out.extend(self._event(e))
        return b"".join(out)

    def _event(self, e: ChatEvent) -> list[bytes]:
        if isinstance(e, Failed):
            self.ended = True
            return [sse_event("error", from_openai_body(error_body(e.error), self.request_id))]
        if isinstance(e, Opened):
            return self._start(e.model)
        out = self._start(None)
        if isinstance(e, UsageReport):
            self.usage = dict(e.usage)
        elif e.choice != 0:
            pass
        elif isinstance(e, TextDelta):
            out += self._text(e.text)
        elif isinstance(e, ToolCallStart):
            if e.call not in self.calls:  # some upstreams repeat a call's id on each of its chunks
                block = {"type": "tool_use", "id": tool_use_id(e.id), "name": e.name, "input": {}}
                out += self._flush(final=False) + self._open("tool_use", block)
                self.calls[e.call] = self.block
        elif isinstance(e, ToolCallDelta):
            out += self._arguments(e.call, e.arguments)
        else:
            self.finish = e.reason
            out += self._flush(final=True) + self._close()
        return out

    def done(self) -> bytes:
        """The end of the answer (unless it failed): message_delta and message_stop."""
        return b"" if self.ended else b"".join(self._done())

    def _start(self, model: object) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": model if isinstance(model, str) and model else self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [sse_event("message_start", {"type": "message_start", "message": message}), PING]

    def _open(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.block += 1
        self.open, self.kind = True, kind
        return [
            *out,
            sse_event("content_block_start", {"type": "content_block_start", "index": self.block, "content_block": block}),
        ]

    def _close(self) -> list[bytes]:
        if not self.open:
            return []
        self.open = False
        return [sse_event("content_block_stop", {"type": "content_block_stop", "index": self.block})]

    def _emit_text(self, text: str) -> list[bytes]:
        if not text:
            return []
        out = [] if self.open and self.kind == "text" else self._open("text", {"type": "text", "text": ""})
        delta = {"type": "content_block_delta", "index": self.block, "delta": {"type": "text_delta", "text": text}}
        return [*out, sse_event("content_block_delta", delta)]

    def _text(self, text: str) -> list[bytes]:
        self.pending += text
        keep = held_back(self.pending, self.stops) if self.stops else 0
        ready, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return self._emit_text(ready)

    def _flush(self, final: bool) -> list[bytes]:
        text, self.pending = self.pending, ""
        if final and self.stop is None:
            text, self.stop = split_stop(text, self.finish, self.stops)
        return self._emit_text(text)

    def _arguments(self, call: int, fragment: str) -> list[bytes]:
        if call not in self.calls or not fragment:
            return []
        delta = {"type": "input_json_delta", "partial_json": fragment}
        return [sse_event("content_block_delta", {"type": "content_block_delta", "index": self.calls[call], "delta": delta})]

    def _done(self) -> list[bytes]:
        self.ended = True
        out = self._start(None) + self._flush(final=True) + self._close()
        counts = usage(self.usage) if self.usage is not None else {"input_tokens": self.input_tokens, "output_tokens": 0}
        delta = {"stop_reason": stop_reason(self.finish, self.stop, self.window), "stop_sequence": self.stop}
        out.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": counts}))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out
