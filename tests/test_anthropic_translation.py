"""gateway/anthropic/ without a server: the request translation (what each field becomes; malformed bodies are
always a 400, never a crash), the stream translator (a chat answer's events in steps of any size, stop sequences
held back, tool calls, failures, keep-alives), x-api-key in the middleware, and a key's priority reaching the engine."""

from __future__ import annotations

import copy
import random
from dataclasses import replace
from typing import Any

import gateway_fixtures
import httpx
import orjson
import pytest
from gateway_fixtures import API_KEY, LiveStack, gateway_test_config

from backend.errors import InvalidRequestError
from gateway.anthropic.fold import held_back, message
from gateway.anthropic.request import translate, translate_count
from gateway.anthropic.response import Shape, split_stop
from gateway.anthropic.stream import PING, EventStream, ping
from gateway.app import build_context, create_app
from gateway.cache.config import CacheConfig
from gateway.errors import GatewayError, InternalError, InvalidRequest, ServiceUnavailable
from gateway.middleware import _with_api_key
from gateway.protocol.answer import BadUpstreamShape, ChatAnswer
from gateway.protocol.events import ChatEvent, Failed, Opened, Step, chunk_events
from gateway.protocol.requests import parse_chat

live = gateway_fixtures.live

CALL = {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}
BODY: dict[str, Any] = {
    "model": "m",
    "max_tokens": 10,
    "system": [{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me see."}, CALL]},
        {"role": "user", "content": [RESULT, {"type": "text", "text": "Thanks."}]},
    ],
    "tools": [{"name": "get", "description": "Weather", "input_schema": SCHEMA}],
    "tool_choice": {"type": "tool", "name": "get", "disable_parallel_tool_use": True},
    "stop_sequences": ["END"],
    "temperature": 0.5,
    "top_p": 0.9,
    "top_k": 40,
    "metadata": {"user_id": "u1"},
    "stream": True,
}


def test_every_field_is_translated() -> None:
    req = translate(BODY)
    assert req.stream and req.stop_sequences == ("END",) and req.model == "m"
    chat = req.chat
    assert chat["messages"] == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me see.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": "Thanks."},
    ]  # fmt: skip
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "get", "description": "Weather", "parameters": BODY["tools"][0]["input_schema"]},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "get"}} and chat["parallel_tool_calls"] is False
    assert chat["stop"] == ["END"] and chat["include_stop_str_in_output"] is True
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["max_tokens"], chat["user"]) == (0.5, 0.9, 40, 10, "u1")
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    parsed = parse_chat(chat)  # the chat pipeline takes it as is
    assert parsed.tools is not None and parsed.params.stop == ("END",) and parsed.params.top_k == 40


def test_only_what_was_sent_is_set() -> None:
    chat = translate({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}).chat
    assert chat == {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    choices = {"auto": "auto", "any": "required", "none": "none"}
    for kind, chat_choice in choices.items():
        out = translate({**BODY, "tool_choice": {"type": kind}}).chat
        assert out["tool_choice"] == chat_choice and "parallel_tool_calls" not in out
    model, count = translate_count({k: BODY[k] for k in ("model", "system", "messages", "tools")})
    assert model == "m" and "max_tokens" not in count and parse_chat(count).tools is not None


def test_consecutive_turns_are_combined() -> None:
    turns = [
        {"role": "user", "content": "Hi."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": "Let me see."},
        {"role": "assistant", "content": [CALL]},
        {"role": "user", "content": [RESULT]},
        {"role": "user", "content": "Thanks."},
    ]
    messages = translate({"model": "m", "max_tokens": 5, "messages": turns}).chat["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert messages[0]["content"] == "Hi.\nWeather?"
    assert messages[1]["content"] == "Let me see." and len(messages[1]["tool_calls"]) == 1


def _mutations(rng: random.Random, body: Any, depth: int = 0) -> Any:
    """`body` with one value somewhere replaced by a random JSON value (or a key dropped or added)."""
    junk = [None, 0, -1, 1.5, "", "x", True, [], {}, [1], {"type": "x"}, [{"type": "text"}], 10**12, {"type": "image"}]
    if isinstance(body, dict) and body and rng.random() < 0.8:
        key = rng.choice(list(body))
        roll = rng.random()
        if roll < 0.15:
            return {k: v for k, v in body.items() if k != key}
        if roll < 0.2:
            return {**body, rng.choice(["extra", "type", "content", "name"]): rng.choice(junk)}
        return {**body, key: _mutations(rng, body[key], depth + 1) if rng.random() < 0.6 else rng.choice(junk)}
    if isinstance(body, list) and body and rng.random() < 0.8:
        i = rng.randrange(len(body))
        return [*body[:i], _mutations(rng, body[i], depth + 1) if rng.random() < 0.6 else rng.choice(junk), *body[i + 1 :]]
    return rng.choice(junk)


def test_malformed_bodies_are_400s_never_crashes() -> None:
    rng = random.Random(24)
    rejected = 0
    for _ in range(3000):
        body = _mutations(rng, copy.deepcopy(BODY))
        try:
            if not isinstance(body, dict):
                continue
            req = translate(body)
            parse_chat({k: v for k, v in req.chat.items() if k != "cache"})
        except (InvalidRequest, InvalidRequestError):
            rejected += 1
    assert rejected > 1000


def _chunk(content: str | None = None, finish: str | None = None, tool: dict[str, Any] | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if tool is not None:
        delta["tool_calls"] = [tool]
    return {"model": "served", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            name, data = block.split("\n")
            event = orjson.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            out.append(event)
    return out


def _run(
    stream: EventStream,
    chunks: list[dict[str, Any]],
    per_step: int,
    failure: GatewayError | None = None,
    steps: list[ChatEvent] | None = None,
) -> list[dict[str, Any]]:
    """The chunks' events (as an upstream's are read), or `steps`' events, `per_step` of them to a step; then the end,
    or `failure`."""
    events: list[ChatEvent] = [Opened(str(chunks[0]["model"]))] + [e for chunk in chunks for e in chunk_events(chunk)]
    events = steps if steps is not None else events
    steps = [Step(tuple(events[i : i + per_step])) for i in range(0, len(events), per_step)]
    if failure is not None:
        steps.append(Step((Failed(failure),)))
    return _events(b"".join(stream.feed(step) for step in steps) + stream.done())


def _text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")


@pytest.mark.parametrize("per_step", [1, 2, 100])
def test_stream_text_with_a_stop_sequence_split_anywhere(per_step: int) -> None:
    chat_usage = {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 5}}
    chunks = [
        _chunk(""),
        _chunk("Hello E"),
        _chunk("NDING E"),
        _chunk("ND", "stop"),
        {"model": "served", "choices": [], "usage": chat_usage},
    ]
    events = _run(EventStream(Shape("msg_1", "asked", ("END",)), 9, request_id="rid"), chunks, per_step)
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert events[0]["message"]["model"] == "served" and events[0]["message"]["usage"] == {"input_tokens": 9, "output_tokens": 0}
    assert _text(events) == "Hello ENDING "
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert events[-2]["usage"] == {  # the prompt's 9 tokens: 5 the prefix cache held, 4 computed
        "input_tokens": 4, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5, "output_tokens": 4
    }  # fmt: skip
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1


def test_stream_held_back_text_is_sent_when_no_stop_sequence_ends_it() -> None:
    chunks = [_chunk("It is EN"), _chunk(None, "length")]
    events = _run(EventStream(Shape("m", "asked", ("END",)), 1, request_id="rid"), chunks, 100)
    assert _text(events) == "It is EN" and events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert held_back("It is EN", ("END", "NOPE")) == 2 and held_back("xyz", ("END",)) == 0


def test_stream_tool_calls_become_tool_use_blocks() -> None:
    chunks = [
        _chunk(""),
        _chunk(tool={"index": 0, "id": "call_abc", "type": "function", "function": {"name": "get", "arguments": ""}}),
        _chunk(tool={"index": 0, "function": {"arguments": '{"city":'}}),
        _chunk(tool={"index": 0, "function": {"arguments": '"Paris"}'}}),
        _chunk(tool={"index": 1, "id": "call_def", "type": "function", "function": {"name": "add", "arguments": "{}"}}),
        _chunk(None, "tool_calls"),
    ]
    events = _run(EventStream(Shape("m", "asked", ()), 1, request_id="rid"), chunks, 2)
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"] for s in starts] == [
        {"type": "tool_use", "id": "toolu_abc", "name": "get", "input": {}},
        {"type": "tool_use", "id": "toolu_def", "name": "add", "input": {}},
    ]
    fragments = [(e["index"], e["delta"]["partial_json"]) for e in events if e["type"] == "content_block_delta"]
    assert fragments == [(0, '{"city":'), (0, '"Paris"}'), (1, "{}")]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_stream_failure_ends_the_stream_with_an_error_event() -> None:
    stream = EventStream(Shape("m", "asked", ()), 1, request_id="rid")
    events = _run(stream, [_chunk("Hi")], 100, InternalError("boom"))
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "boom"}, "request_id": "rid"}
    assert "message_stop" not in [e["type"] for e in events] and _text(events) == "Hi"
    assert stream.feed(Step(tuple(chunk_events(_chunk("late"))))) == b""  # nothing after the error
    busy = _events(EventStream(Shape("m", "asked", ()), 1, request_id="rid").feed(Step((Failed(ServiceUnavailable("later")),))))
    assert busy[-1]["error"]["type"] == "overloaded_error"


def test_stream_keep_alive_is_a_ping_event() -> None:
    assert ping().encode() == PING == b'event: ping\ndata: {"type":"ping"}\n\n'


def _message(chat: dict[str, Any], stops: tuple[str, ...] = (), window: bool = False) -> dict[str, Any]:
    return message(ChatAnswer.of(chat), Shape("msg_1", "asked", stops, window))


def test_non_streamed_message() -> None:
    chat = {
        "model": "served",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi END"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    msg = _message(chat, ("END", "D"))
    assert msg["content"] == [{"type": "text", "text": "Hi "}] and msg["stop_sequence"] == "END"
    assert msg["stop_reason"] == "stop_sequence" and msg["usage"] == {
        "input_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 2
    }  # fmt: skip
    assert msg["id"] == "msg_1" and msg["model"] == "served" and msg["type"] == "message" and msg["role"] == "assistant"
    assert split_stop("Hi END", "length", ("END",)) == ("Hi END", None)
    chat["choices"][0]["finish_reason"] = "length"
    assert _message(chat)["stop_reason"] == "max_tokens"
    assert _message(chat, window=True)["stop_reason"] == "model_context_window_exceeded"
    calls = [{"id": "call_x", "type": "function", "function": {"name": "get", "arguments": '{"a":1}'}}]
    chat["choices"][0] = {"index": 0, "message": {"content": None, "tool_calls": calls}, "finish_reason": "tool_calls"}
    msg = _message(chat)
    assert msg["content"] == [{"type": "tool_use", "id": "toolu_x", "name": "get", "input": {"a": 1}}]
    assert msg["stop_reason"] == "tool_use"
    calls[0]["function"]["arguments"] = {"a": 2}  # type: ignore[index]  # an upstream that sends the object itself
    assert _message(chat)["content"][0]["input"] == {"a": 2}
    del chat["usage"]  # an upstream that counts nothing: zero counts, not a missing field
    assert set(_message(chat)["usage"].values()) == {0} and len(_message(chat)["usage"]) == 4


def _blocks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks a client puts together from a stream's events."""
    blocks = [dict(e["content_block"]) for e in events if e["type"] == "content_block_start"]
    partial = [""] * len(blocks)
    for e in events:
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta":
            blocks[e["index"]]["text"] += e["delta"]["text"]
        elif e["type"] == "content_block_delta":
            partial[e["index"]] += e["delta"]["partial_json"]
    for block, arguments in zip(blocks, partial, strict=True):
        if block["type"] == "tool_use":
            block["input"] = orjson.loads(arguments or "{}")
    return blocks


@pytest.mark.parametrize("stops", [(), ("END",), ("END", "D", "xx")])
def test_the_whole_message_is_the_fold_of_its_stream(stops: tuple[str, ...]) -> None:
    """One event model, two renderings: a chat answer's Message is what its stream's events add up to."""
    usage = {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 5}}
    calls = [{"id": "call_a", "function": {"name": "get", "arguments": '{"city":"Paris"}'}},
             {"id": "call_b", "function": {"name": "add", "arguments": ""}}]  # fmt: skip
    answers = [
        {"content": "Hello ENDING END"},
        {"content": "Hello xx", "finish": "length"},
        {"content": "Let me look.", "tool_calls": calls, "finish": "tool_calls"},
        {"content": None, "tool_calls": calls[:1], "finish": "tool_calls"},
    ]
    for a in answers:
        choice = {"index": 0, "message": {"content": a["content"], "tool_calls": a.get("tool_calls")},
                  "finish_reason": a.get("finish", "stop")}  # fmt: skip
        chat = {"model": "served", "choices": [choice], "usage": usage}
        whole = _message(chat, stops)
        events = _run(EventStream(Shape("msg_1", "asked", stops), 9, request_id="rid"), [chat], 1,
                      steps=ChatAnswer.of(chat).events())  # fmt: skip
        assert events[0]["message"]["model"] == whole["model"] == "served"
        assert _blocks(events) == whole["content"]
        (end,) = [e for e in events if e["type"] == "message_delta"]
        assert end["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}
        assert end["usage"] == whole["usage"]


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"choices": [{"index": 0, "text": "a completion, not a chat answer"}]}, "unexpected shape"),
        ({"choices": [{"index": 0, "message": {"content": [{"type": "text", "text": "parts"}]}}]}, "unexpected shape"),
        ({"choices": {"0": {"message": {"content": "a map"}}}}, "unexpected shape"),
        ({"choices": []}, "unexpected shape"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}}]}, "not valid JSON"),
        ({"choices": [{"message": {"tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}}]}, "not a JSON object"),
    ],
)
def test_an_answer_in_another_shape_is_a_clear_502(body: dict[str, Any], says: str) -> None:
    with pytest.raises(BadUpstreamShape) as err:
        message(ChatAnswer.of(body), Shape("msg_1", "asked", ()))
    assert err.value.status == 502 and says in err.value.message


def test_x_api_key_stands_for_a_bearer_key() -> None:
    scope = {"headers": [(b"x-api-key", b"sk-1")]}
    assert (b"authorization", b"Bearer sk-1") in _with_api_key(scope)["headers"]
    both = {"headers": [(b"x-api-key", b"sk-1"), (b"authorization", b"Bearer sk-2")]}
    assert _with_api_key(both) is both


class PrioritySpy:
    """The real engine, noting the priority each request was submitted with."""

    def __init__(self, real: Any) -> None:
        self.real, self.priorities = real, []
        self.model_name, self.max_model_len = real.model_name, real.max_model_len

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def generate(self, prompt: Any, params: Any, request_id: str) -> Any:
        self.priorities.append(params.priority)
        return self.real.generate(prompt, params, request_id)


async def test_the_keys_priority_applies_with_x_api_key(live: LiveStack) -> None:
    spy = PrioritySpy(live.engine)
    config = replace(gateway_test_config(), api_key_priorities={API_KEY: 7}, cache=CacheConfig(backend="off"))
    app = create_app(build_context(config, spy, None, log_sink=open("/dev/null", "w")), manage_engine=False)  # noqa: SIM115
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        resp = await client.post("/v1/messages", json=body, headers={"x-api-key": API_KEY})
    assert resp.status_code == 200 and resp.json()["type"] == "message"
    assert spy.priorities == [7]
