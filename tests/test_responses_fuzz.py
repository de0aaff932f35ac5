"""Bad input to /v1/responses is always a clear 4xx, never a 5xx: every field of a valid body (top level, input
items, content parts, tools, tool_choice, text.format) replaced by values of every JSON type, against a live
gateway without an engine (a body that passes validation ends at the model lookup: 404, nothing generated)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from routing_fixtures import Servers

from gateway.app import build_context, create_app
from gateway.config import GatewayConfig

KEY = "sk-resp-fuzz"
VALID: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ],
    "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}],
    "tool_choice": "none",  # tools with text.format is a 400 of its own
    "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
    "max_output_tokens": 16,
    "temperature": 0,
    "top_p": 1,
    "metadata": {"a": "b"},
    "reasoning": {"effort": None},
    "include": ["message.output_text.logprobs"],
    "top_logprobs": 2,
    "truncation": "auto",
    "previous_response_id": None,
    "store": False,
    "stream": False,
    "parallel_tool_calls": True,
}
VALUES: list[Any] = [None, 0, -1, 1.5, 10**12, "", "x", True, [], [1], ["x"], {}, {"type": "x"}, [{}], [{"type": "message"}]]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from _paths(value, (*prefix, i))


def _replaced(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    body = copy.deepcopy(VALID)
    node: Any = body
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return body


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    servers = Servers()
    config = GatewayConfig(api_keys=(KEY,), embeddings=False)
    (base,) = servers.start([create_app(build_context(config, None, None))])
    yield base
    servers.stop()


def test_every_field_with_every_type_is_a_4xx(url: str) -> None:
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as client:
        assert client.post("/v1/responses", json=VALID).status_code == 404  # valid: the engine-less model lookup
        for path in _paths(VALID):
            for value in VALUES:
                r = client.post("/v1/responses", json=_replaced(path, value))
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                assert r.status_code < 500, (path, value, r.text)
                error = r.json()["error"]
                assert set(error) == {"message", "type", "param", "code"} and error["message"], (path, value)
        for body in ([], "x", 1, None):
            assert client.post("/v1/responses", json=body).status_code == 400
            assert client.post("/v1/responses/input_tokens", json=body).status_code == 400
    assert statuses.get(400, 0) > 100
