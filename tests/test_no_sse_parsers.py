"""Issue #39's bar: no SSE parser in the gateway except the one for real upstreams (gateway/routing/upstream.py).

Endpoints that build on the chat pipeline (/v1/responses, /v1/messages) take its answer as typed steps
(gateway/protocol/events.py); reading SSE bytes back in process would be a second, third... parser. A parser
is found by what it must do: look for a field name (`data:`, `event:`) at the start of a line, or cut a byte
stream into events at the blank line (`\\n\\n`). Writing SSE (b"data: " + ...) is not reading it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWED = {
    "gateway/routing/upstream.py",  # the upstream client: a real remote's SSE
}
_READS = {"startswith", "removeprefix", "split", "find", "index", "partition", "lstrip", "rfind", "splitlines"}
_FIELDS = ("data:", "event:")


def _text(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
        value = node.value
        return value.decode("latin-1") if isinstance(value, bytes) else value
    return None


def _reads_sse(node: ast.AST) -> bool:
    """A call that looks for an SSE field at a line's start, or cuts a stream at the blank line between events;
    or a test that a buffer holds such a blank line."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _READS:
        for arg in node.args:
            text = _text(arg)
            if text is not None and (text.startswith(_FIELDS) or _blank_line(arg)):
                return True
    if isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
        return _blank_line(node.left)
    return False


def _blank_line(node: ast.AST) -> bool:
    """b"\\n\\n": the end of an event in a byte stream (a str split on it is prose: paragraphs of a docstring)."""
    return isinstance(node, ast.Constant) and node.value == b"\n\n"


def parsers(source: str) -> list[int]:
    """The lines of `source` that read SSE."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if _reads_sse(node)]


def test_only_the_upstream_client_parses_sse() -> None:
    found = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = parsers(path.read_text())
        if lines:
            found[rel] = lines
    assert set(found) == ALLOWED, f"SSE read outside the upstream client: {sorted(set(found) - ALLOWED)} at {found}"


def test_the_check_finds_the_parsers_it_forbids() -> None:
    """The shapes the removed in-process parsers had (bridge.py, anthropic/stream.py) are all caught."""
    assert parsers('while b"\\n\\n" in buf:\n    block, buf = buf.split(b"\\n\\n", 1)') == [1, 2]
    assert parsers('end = self.buffer.find(b"\\n\\n")') == [1]
    assert parsers('if line.startswith(b"event:"):\n    name = line[6:].strip()') == [1]
    assert parsers('payload = line.removeprefix("data: ")') == [1]
    assert parsers('out = b"data: " + orjson.dumps(obj) + b"\\n\\n"') == []  # writing SSE is fine
