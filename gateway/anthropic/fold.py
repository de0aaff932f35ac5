"""The chat answer's events (gateway/protocol/events.py) folded into one Anthropic Message.

One fold serves both shapes, as ResponseBuilder does for Responses: a streamed answer's events are taken as they
come, each returning the Anthropic stream events it makes (stream.py sends them); a whole answer (a `ChatAnswer`,
gateway/protocol/answer.py) is taken as the events its stream would carry, and `message()` is the Message. So the
text deltas of a stream add up to exactly the non-streamed answer's text, with the same stop sequence cut off.

Text becomes a `text` block; each tool call a `tool_use` block whose arguments arrive as `input_json_delta` fragments
(parsed into its `input` in the whole Message). With stop_sequences, text that may be the start of one is held back
until it is known not to be (the one that ended the answer is never sent).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.anthropic.response import Shape, split_stop, stop_reason, tool_input, tool_use_id, usage
from gateway.protocol.answer import UNEXPECTED, BadUpstreamShape, ChatAnswer
from gateway.protocol.events import ChatEvent, Failed, Finish, Opened, TextDelta, ToolCallDelta, ToolCallStart, UsageReport

AnthropicEvent = tuple[str, dict[str, object]]  # a stream event: its name and its data


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin (or be) a stop sequence."""
    best = 0
    for stop in stops:
        for k in range(min(len(stop), len(text)), best, -1):
            if stop.startswith(text[-k:]):
                best = k
                break
    return best


@dataclass
class _Block:
    """A content block: `text` is a text block's text, or a tool_use block's JSON arguments so far."""

    kind: str  # text | tool_use
    text: str = ""
    id: str = ""
    name: str = ""

    def content(self) -> dict[str, object]:
        if self.kind == "text":
            return {"type": "text", "text": self.text}
        return {"type": "tool_use", "id": self.id, "name": self.name, "input": tool_input(self.text)}


class MessageFold:
    """Take the chat answer's events (choice 0: Messages has no `n`); each returns the Anthropic events it makes."""

    def __init__(self, shape: Shape, input_tokens: int) -> None:
        """`input_tokens`: the prompt's size message_start reports (the answer's own count comes with its usage)."""
        self.shape = shape
        self.input_tokens = input_tokens
        self.model = shape.model  # the model that answers, once the answer names it
        self.started = False
        self.blocks: list[_Block] = []
        self.open = False  # whether the last block still is
        self.calls: dict[int, int] = {}  # chat tool-call index -> block index
        self.pending = ""  # text held back: it may begin a stop sequence
        self.finish: str | None = None
        self.stop: str | None = None
        self.usage: UsageReport | None = None

    def take(self, e: ChatEvent) -> list[AnthropicEvent]:
        """The events one chat event makes (a failure is the caller's: it ends the stream)."""
        if isinstance(e, Failed):
            return []
        if isinstance(e, Opened):
            return self._start(e.model)
        out = self._start("")
        if isinstance(e, UsageReport):
            self.usage = e
        elif e.choice != 0:
            pass
        elif isinstance(e, TextDelta):
            out += self._text(e.text)
        elif isinstance(e, ToolCallStart):
            if e.call not in self.calls:  # some upstreams repeat a call's id on each of its chunks
                out += self._flush(final=False) + self._open(_Block("tool_use", id=tool_use_id(e.id), name=e.name))
                self.calls[e.call] = len(self.blocks) - 1
        elif isinstance(e, ToolCallDelta):
            out += self._arguments(e.call, e.arguments)
        else:
            out += self._finish(e)
        return out

    def end(self) -> list[AnthropicEvent]:
        """The end of the answer: message_delta (stop reason, the answer's usage) and message_stop."""
        out = self._start("") + self._flush(final=True) + self._close()
        counts = usage(self.usage) if self.usage is not None else {"input_tokens": self.input_tokens, "output_tokens": 0}
        delta = {"stop_reason": stop_reason(self.finish, self.stop, self.shape.window), "stop_sequence": self.stop}
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": counts}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def message(self) -> dict[str, object]:
        """The whole Message folded so far (after `end`: the answer's)."""
        return {
            "id": self.shape.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [block.content() for block in self.blocks],
            "stop_reason": stop_reason(self.finish, self.stop, self.shape.window),
            "stop_sequence": self.stop,
            "usage": usage(self.usage),
        }

    def _start(self, model: str) -> list[AnthropicEvent]:
        if self.started:
            return []
        self.started = True
        self.model = model or self.model
        message: dict[str, object] = {
            "id": self.shape.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _finish(self, e: Finish) -> list[AnthropicEvent]:
        self.finish = e.reason
        return self._flush(final=True) + self._close()

    def _open(self, block: _Block) -> list[AnthropicEvent]:
        """Close the open block, open `block` (empty: its content_block_start says what it is)."""
        out = self._close()
        self.blocks.append(block)
        self.open = True
        start = {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": block.content()}
        return [*out, ("content_block_start", start)]

    def _close(self) -> list[AnthropicEvent]:
        if not self.open:
            return []
        self.open = False
        return [("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1})]

    def _emit_text(self, text: str) -> list[AnthropicEvent]:
        if not text:
            return []
        out = [] if self.open and self.blocks[-1].kind == "text" else self._open(_Block("text"))
        self.blocks[-1].text += text
        delta = {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": {"type": "text_delta", "text": text}}
        return [*out, ("content_block_delta", delta)]

    def _text(self, text: str) -> list[AnthropicEvent]:
        self.pending += text
        stops = self.shape.stops
        keep = held_back(self.pending, stops) if stops else 0
        ready, self.pending = self.pending[: len(self.pending) - keep], self.pending[len(self.pending) - keep :]
        return self._emit_text(ready)

    def _flush(self, final: bool) -> list[AnthropicEvent]:
        text, self.pending = self.pending, ""
        if final and self.stop is None:
            text, self.stop = split_stop(text, self.finish, self.shape.stops)
        return self._emit_text(text)

    def _arguments(self, call: int, fragment: str) -> list[AnthropicEvent]:
        if call not in self.calls or not fragment:
            return []
        index = self.calls[call]
        self.blocks[index].text += fragment
        delta = {"type": "input_json_delta", "partial_json": fragment}
        return [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})]


def message(answer: ChatAnswer, shape: Shape) -> dict[str, object]:
    """The Anthropic Message for a whole chat answer (its first choice): the fold of the events its stream would
    carry."""
    first = answer.first()
    if not first.choices:
        raise BadUpstreamShape(UNEXPECTED)
    fold = MessageFold(shape, 0)
    for e in first.events():
        fold.take(e)
    fold.end()
    return fold.message()
