"""gateway/openai_responses without a model: request translation, items, the event builder (checked against
the OpenAPI spec), the chat pipeline's streamed answer read as typed steps (a stream that breaks ends in
`error` + response.failed), a chat JSON response run in process (run_json), and the store's TTL, LRU and tenant keys."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from gateway_fixtures import assert_schema
from starlette.responses import Response

from gateway.errors import GatewayError, InternalError, InvalidRequest, error_body
from gateway.openai_responses.api import StreamBroke
from gateway.openai_responses.builder import ResponseBuilder, feed_completion, feed_events
from gateway.openai_responses.items import chat_messages
from gateway.openai_responses.request import chat_body, echo_fields, parse_request
from gateway.openai_responses.store import MemoryResponseStore, StoredResponses
from gateway.protocol.answer import ChatAnswer, InnerError, run_json
from gateway.protocol.events import Failed, Opened, Step, TextDelta, chunk_events, steps_of
from gateway.protocol.jsonio import json_response
from gateway.protocol.sse import DONE, ChatStream, StreamLimits, sse_data, sse_error

_counter = itertools.count()


def new_id(prefix: str) -> str:
    return f"{prefix}{next(_counter):032x}"


def _builder(**body: Any) -> ResponseBuilder:
    req = parse_request({"model": "m", "input": "hi", **body}, new_id)
    return ResponseBuilder(new_id("resp_"), echo_fields(req), new_id)


def _chunk(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    choices = [] if delta is None and finish is None else [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": choices, "usage": usage}


def feed_chunk(b: ResponseBuilder, chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat chunk as an upstream sends it, read into events (the first opens the answer) and fed to the builder."""
    opened = [] if b.started else [Opened(str(chunk["model"]))]
    return feed_events(b, [*opened, *chunk_events(chunk)])


USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 2}}


# ---- request translation -------------------------------------------------------------------------------------


def test_chat_body_carries_every_setting() -> None:
    req = parse_request(
        {
            "model": "m", "input": "hi", "instructions": "Be brief.", "max_output_tokens": 32, "temperature": 0.2,
            "top_p": 0.9, "user": "u", "stream": True, "seed": 7,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": True}},
        },
        new_id,
    )  # fmt: skip
    body = chat_body(req, chat_messages(req.input, 0), "m")
    assert body["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert body["max_completion_tokens"] == 32 and body["temperature"] == 0.2 and body["top_p"] == 0.9 and body["seed"] == 7
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True} and body["user"] == "u"
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
    }


def test_tools_and_tool_choices_translate() -> None:
    tools = [{"type": "function", "name": n, "parameters": {"type": "object"}} for n in ("a", "b")]
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "b"}]}
    for choice, chat_choice, names in [
        (None, "auto", ["a", "b"]),
        ("required", "required", ["a", "b"]),
        ({"type": "function", "name": "a"}, {"type": "function", "function": {"name": "a"}}, ["a", "b"]),
        (allowed, "required", ["b"]),
    ]:
        req = parse_request(
            {"model": "m", "input": "hi", "tools": tools, "tool_choice": choice, "parallel_tool_calls": False}, new_id
        )
        body = chat_body(req, [{"role": "user", "content": "hi"}], "m")
        assert body["tool_choice"] == chat_choice and [t["function"]["name"] for t in body["tools"]] == names
        assert body["parallel_tool_calls"] is False
    req = parse_request({"model": "m", "input": "hi", "tools": tools, "tool_choice": "none"}, new_id)
    assert "tools" not in chat_body(req, [{"role": "user", "content": "hi"}], "m")
    assert req.tools[0]["strict"] is True  # Responses function tools are strict unless told otherwise


def _items(given: list[dict[str, Any]], new_id: Callable[[str], str]) -> list[dict[str, Any]]:
    """The input items as stored (declared by ResponsesBody, then given ids)."""
    return parse_request({"model": "m", "input": given}, new_id).input


def test_items_become_chat_messages() -> None:
    items = _items(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": '{"x":1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
        ],
        new_id,
    )
    assert all(item["id"] for item in items)
    messages = chat_messages(items, 0)
    assert messages[:2] == [{"role": "system", "content": "S"}, {"role": "user", "content": "a\nb"}]
    assert messages[2]["content"] == "Let me check." and [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
    ]
    with pytest.raises(InvalidRequest) as err:
        chat_messages(_items([{"type": "function_call_output", "call_id": "zz", "output": "x"}], new_id), 0)
    assert err.value.param == "input[0]"


# ---- the builder ---------------------------------------------------------------------------------------------


def test_builder_events_text_then_tool_call_fit_the_spec() -> None:
    b = _builder(tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}])
    events = feed_chunk(b, _chunk({"role": "assistant", "content": ""}))
    events += feed_chunk(b, _chunk({"content": "Hel"}))
    events += feed_chunk(b, _chunk({"content": "lo"}))
    events += feed_chunk(
        b, _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]})
    )
    events += feed_chunk(b, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}))
    events += feed_chunk(b, _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}))
    events += feed_chunk(b, _chunk(finish="tool_calls"))
    events += feed_chunk(b, _chunk(usage=USAGE))
    events += b.complete()
    for event in events:
        assert_schema("ResponseStreamEvent", event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    final = events[-1]["response"]
    assert_schema("Response", final)
    assert final["output"][0]["content"][0]["text"] == "Hello" and final["output"][1]["arguments"] == '{"a":1}'
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 2 and final["usage"]["total_tokens"] == 15
    assert events[2]["item"]["content"] == [] and events[2]["item"]["status"] == "in_progress"


def test_sent_events_are_snapshots_later_deltas_do_not_change() -> None:
    """Events made in one step are written together: an item or part sent as added stays as it was then."""
    b = _builder()
    logprobs = {"content": [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": []}]}
    events = feed_events(b, [Opened("m"), TextDelta(0, "Hi", logprobs), TextDelta(0, "!", logprobs)])
    added = next(e for e in events if e["type"] == "response.content_part.added")
    assert added["part"] == {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    item = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    assert item["content"] == [] and item["status"] == "in_progress"
    done = b.complete()
    assert done[0]["type"] == "response.output_text.done" and done[0]["text"] == "Hi!" and len(done[0]["logprobs"]) == 2
    assert b.response()["output"][0]["content"][0]["text"] == "Hi!"


def test_non_streaming_equals_the_streamed_final_object() -> None:
    completion = {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m", "usage": USAGE,
        "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "Hello"}}],
    }  # fmt: skip
    ids = iter(["resp_1", "msg_1", "resp_1", "msg_1"])
    one = ResponseBuilder("resp_1", echo_fields(parse_request({"model": "m", "input": "hi"}, new_id)), lambda p: next(ids))
    final = feed_completion(one, ChatAnswer.of(completion))
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][0]["status"] == "incomplete"
    assert_schema("Response", final)


# ---- the chat pipeline's streamed answer, read as steps ------------------------------------------------------

SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/v1/responses",
    "headers": [],
    "query_string": b"",
    "asgi": {"version": "3.0"},
}
LIMITS = StreamLimits(ping_s=15, send_timeout_s=5, drain_s=1)
INTERNAL = InternalError("The server had an internal error while processing the request.")  # what a crash becomes


def _chat_stream(chunks: list[dict[str, Any]], closed: list[str]) -> ChatStream:
    """A ChatStream over steps made from chat chunks, which breaks after them (as an engine that fails would)."""

    async def steps() -> AsyncIterator[Step]:
        yield Step((Opened("m"), *chunk_events(chunks[0])), sse_data(chunks[0]))
        for chunk in chunks[1:]:
            yield Step(tuple(chunk_events(chunk)), sse_data(chunk))
        raise RuntimeError("the engine failed")

    class Engine:  # an engine request's stream: closing it aborts the request
        async def aclose(self) -> None:
            closed.append("engine")

    return ChatStream(steps(), lambda step: b"", lambda exc, err: None, 1, engine_streams=[Engine()], limits=LIMITS,  # type: ignore[list-item]
                      on_disconnect=lambda: None)


async def _sent(response: ChatStream) -> bytes:
    body: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        body.append(message.get("body", b""))

    await response(SCOPE, receive, send)
    return b"".join(body)


async def test_a_broken_chat_stream_fails_the_response_and_its_wire_ends_with_the_error_event() -> None:
    chunks = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Hi"})]
    closed: list[str] = []
    steps = steps_of(_chat_stream(chunks, closed))
    got = [step async for step in steps]
    await steps.aclose()
    assert closed == ["engine"]  # closing the steps closes what produces them
    failure = got[-1].events[0]
    assert isinstance(failure, Failed) and failure.error.message == INTERNAL.message
    b = _builder()
    events = [e for step in got[:-1] for e in feed_events(b, step.events)]
    events += b.fail(StreamBroke(error_body(failure.error)))
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    for event in events:
        assert_schema("ResponseStreamEvent", event)
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "Hi"
    # sent as chat chunks instead: the steps' own bytes, then the error event, no [DONE]
    wire = await _sent(_chat_stream(chunks, []))
    assert wire.startswith(sse_data(chunks[0]) + sse_data(chunks[1]))
    assert wire.endswith(sse_error(INTERNAL))
    assert DONE not in wire


async def test_bridge_json_and_inner_errors() -> None:
    _, answer = await run_json(json_response({"object": "chat.completion", "model": "m", "choices": []}), SCOPE)
    assert answer == ChatAnswer("m", (), None)
    with pytest.raises(GatewayError) as err:
        await run_json(json_response({"error": {"message": "nope", "type": "invalid_request_error"}}, status=400), SCOPE)
    assert isinstance(err.value, InnerError) and err.value.answer_status == 400 and err.value.message == "nope"
    assert err.value.error_type == "invalid_request_error"
    with pytest.raises(InnerError) as err:
        await run_json(Response(b"not json", media_type="application/json"), SCOPE)
    assert err.value.answer_status == 200 and err.value.error_type == "server_error"


# ---- the store ---------------------------------------------------------------------------------------------------


async def test_memory_store_ttl_lru_and_tenants() -> None:
    now = [0.0]
    store = MemoryResponseStore(max_entries=2, clock=lambda: now[0])
    stored = StoredResponses(store, "p", ttl_s=10, logger=None)
    await stored.put("Bearer a", "resp_1", {"x": 1})
    assert await stored.get("Bearer a", "resp_1") == {"x": 1}
    assert await stored.get("Bearer b", "resp_1") is None  # another tenant's key
    assert not await stored.delete("Bearer b", "resp_1")
    now[0] = 11.0
    assert await stored.get("Bearer a", "resp_1") is None  # expired
    for i in range(3):
        await stored.put("Bearer a", f"resp_{i}", {"i": i})
    assert await stored.get("Bearer a", "resp_0") is None and await stored.get("Bearer a", "resp_2") == {"i": 2}  # LRU
