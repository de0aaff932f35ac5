"""Incremental parser of generated text into plain content and tool calls (see gateway/protocol/tools.py).

The grammar makes the text either plain content (never starting with `<`) or calls in the exact
compact form `<tool_call>{"name":"NAME","arguments":ARGS}</tool_call>`, so the parser is a small
state machine: it streams ARGS as it arrives, holding back only what could be the closing `}</tool_call>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gateway.protocol.tools import CLOSE, OPEN

_HEAD = re.compile(r"\s*" + re.escape(OPEN) + r'\{"name":"([a-zA-Z0-9_-]+)","arguments":')
_HOLD = len(CLOSE)  # the longest suffix that may be the start of "}</tool_call>" minus one character


@dataclass(frozen=True)
class Content:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    name: str


@dataclass(frozen=True)
class Arguments:
    index: int
    fragment: str


Event = Content | CallStart | Arguments


@dataclass
class ToolCallParser:
    buf: str = ""
    mode: str = "undecided"  # | "text" | "calls"
    calls: int = 0
    in_call: bool = False
    events: list[Event] = field(default_factory=list)

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        if self.mode == "undecided" and self.buf:
            self.mode = "calls" if self.buf.lstrip().startswith("<") else "text"
            if self.mode == "calls" and not self.buf.lstrip():
                self.mode = "undecided"
        if self.mode == "text":
            out, self.buf = self.buf, ""
            return [Content(out)] if out else []
        return self._calls() if self.mode == "calls" else []

    def finish(self) -> list[Event]:
        """End of output: flush what is left (a call cut short by max_tokens keeps its partial arguments)."""
        rest, self.buf = self.buf, ""
        if self.mode == "undecided" and rest:
            return [Content(rest)]
        if self.mode == "calls" and self.in_call and rest:
            return [Arguments(self.calls - 1, rest)]
        return []

    def _calls(self) -> list[Event]:
        out: list[Event] = []
        while True:
            if not self.in_call:
                head = _HEAD.match(self.buf)
                if head is None:
                    return out
                out.append(CallStart(self.calls, head.group(1)))
                self.calls += 1
                self.in_call = True
                self.buf = self.buf[head.end() :]
            end = self.buf.find(CLOSE)
            if end < 0:
                ready, self.buf = self.buf[: max(len(self.buf) - _HOLD, 0)], self.buf[max(len(self.buf) - _HOLD, 0) :]
                if ready:
                    out.append(Arguments(self.calls - 1, ready))
                return out
            args = self.buf[: end - 1]  # the `}` before the tag closes the call object
            if args:
                out.append(Arguments(self.calls - 1, args))
            self.buf = self.buf[end + len(CLOSE) :]
            self.in_call = False


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str


def parse_all(text: str) -> tuple[str, list[ParsedCall]]:
    """The whole output at once: (content, calls)."""
    parser = ToolCallParser()
    events = parser.feed(text) + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    names = [e.name for e in events if isinstance(e, CallStart)]
    args = [""] * len(names)
    for e in events:
        if isinstance(e, Arguments):
            args[e.index] += e.fragment
    return content, [ParsedCall(n, a) for n, a in zip(names, args, strict=True)]
