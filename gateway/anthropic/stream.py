"""The chat pipeline's SSE stream (chat.completion.chunk `data:` lines) -> Anthropic's stream events.

    message_start, ping, (content_block_start, content_block_delta..., content_block_stop)...,
    message_delta (stop_reason, stop_sequence, usage), message_stop

Text becomes a `text` block of `text_delta`s; each tool call a `tool_use` block whose arguments arrive
as `input_json_delta` fragments. The chat stream's keep-alive comments become `ping` events and its
`error` event an Anthropic `error` event. With stop_sequences, text that may be the start of one is
held back until it is known not to be (the one that ended the answer is never sent), so the text
deltas add up to exactly the non-streamed answer's text.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.anthropic.errors import from_openai_body, sse_event
from gateway.anthropic.response import split_stop, stop_reason, tool_use_id, usage

PING = sse_event("ping", {"type": "ping"})


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
    """Feed it the chat stream's bytes as they come; it returns the Anthropic events to send."""

    def __init__(
        self, message_id: str, model: str, input_tokens: int, stops: tuple[str, ...], *, request_id: str, window: bool = False
    ) -> None:
        self.window = window
        self.message_id = message_id
        self.model = model
        self.input_tokens = input_tokens
        self.stops = stops
        self.request_id = request_id
        self.buffer = b""
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

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out: list[bytes] = []
        while not self.ended:
            end = self.buffer.find(b"\n\n")
            if end < 0:
                break
            block, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            out.extend(self._event(block))
        return b"".join(out)

    def _event(self, block: bytes) -> list[bytes]:
        name, data, comment = b"", [], False
        for line in block.replace(b"\r", b"").split(b"\n"):
            if line.startswith(b":"):
                comment = True
            elif line.startswith(b"event:"):
                name = line[6:].strip()
            elif line.startswith(b"data:"):
                data.append(line[5:].strip())
        if not data:
            return [PING] if comment else []
        payload = b"\n".join(data)
        if payload == b"[DONE]":
            return self._done()
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            obj = {"error": {"message": "The model's stream could not be read."}}
        if name == b"error" or not isinstance(obj, dict) or "error" in obj:
            self.ended = True
            return [sse_event("error", from_openai_body(obj, self.request_id))]
        return self._chunk(obj)

    def _start(self, model: object) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        message = {
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

    def _chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._start(chunk.get("model"))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                out += self._text(delta["content"])
            for call in delta.get("tool_calls") or ():
                out += self._tool(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                out += self._flush(final=True) + self._close()
        return out

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

    def _tool(self, call: dict[str, Any]) -> list[bytes]:
        index = call.get("index", 0)
        fn = call.get("function") or {}
        out: list[bytes] = []
        if index not in self.calls:
            block = {"type": "tool_use", "id": tool_use_id(call.get("id")), "name": fn.get("name"), "input": {}}
            out = self._flush(final=False) + self._open("tool_use", block)
            self.calls[index] = self.block
        if fn.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": fn["arguments"]}
            out.append(
                sse_event("content_block_delta", {"type": "content_block_delta", "index": self.calls[index], "delta": delta})
            )
        return out

    def _done(self) -> list[bytes]:
        self.ended = True
        out = self._start(None) + self._flush(final=True) + self._close()
        counts = usage(self.usage) if self.usage is not None else {"input_tokens": self.input_tokens, "output_tokens": 0}
        delta = {"stop_reason": stop_reason(self.finish, self.stop, self.window), "stop_sequence": self.stop}
        out.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": counts}))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out
