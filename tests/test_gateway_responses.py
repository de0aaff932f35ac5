"""/v1/responses against live servers (the real engine), through the official `openai` SDK and raw HTTP:
text, streaming events, tools, structured output, stored responses, tenants, Redis replicas, the cache,
400s for what the gateway cannot do; every response and event validated against the OpenAPI spec."""

from __future__ import annotations

import json
import uuid
from typing import Any

import cache_fixtures
import httpx
import openai
import pytest
from cache_fixtures import OTHER_KEY, CacheStack
from client_requests import CODEX, CODEX_LEFT_OUT, CODEX_OFFERED
from gateway_fixtures import API_KEY, assert_schema
from pydantic import BaseModel

cache_stack = cache_fixtures.cache_stack

MODEL = "gpt-4o-mini"
TIMEOUT = 600
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {
    "type": "function",
    "name": "get_time",
    "description": "Get the current time in a time zone.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}


def _unique(text: str) -> str:
    return f"{text} (case {uuid.uuid4().int % 10**8})"


def _client(stack: CacheStack, name: str = "memory", key: str = API_KEY) -> openai.OpenAI:
    """The SDK client for one of the stack's servers, patient: the tests share two CPU cores with much else."""
    stack.client(name, key)  # skips when that server is absent (no redis-server)
    return openai.OpenAI(base_url=f"{stack.urls[name]}/v1", api_key=key, max_retries=0, timeout=TIMEOUT)


def _headers(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _post(url: str, body: dict[str, Any], key: str = API_KEY) -> httpx.Response:
    return httpx.post(f"{url}/v1/responses", json=body, headers=_headers(key), timeout=TIMEOUT)


def _events(url: str, body: dict[str, Any], key: str = API_KEY) -> tuple[httpx.Headers, list[dict[str, Any]]]:
    """A streamed response's events, each checked: its SSE `event:` name is its type, it fits the spec."""
    events = []
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True}, headers=_headers(key), timeout=TIMEOUT) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                event = json.loads(line[5:])
                assert event["type"] == name
                assert_schema("ResponseStreamEvent", event)
                events.append(event)
        return r.headers, events


def _check_sequence(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The event grammar: numbering, lifecycle, items opened and closed in order; the final response."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete", "response.failed")
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert all(e["response"]["id"] == final["id"] for e in events if "response" in e)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == [e["output_index"] for e in done] == list(range(len(final["output"])))
    assert [e["item"] for e in done] == final["output"]
    for item_event in done:
        item = item_event["item"]
        if item["type"] == "message":
            deltas = "".join(
                e["delta"] for e in events if e["type"] == "response.output_text.delta" and e["item_id"] == item["id"]
            )
            (text_done,) = [e for e in events if e["type"] == "response.output_text.done" and e["item_id"] == item["id"]]
            assert deltas == text_done["text"] == item["content"][0]["text"]
        else:
            deltas = "".join(
                e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta" and e["item_id"] == item["id"]
            )
            (args_done,) = [
                e for e in events if e["type"] == "response.function_call_arguments.done" and e["item_id"] == item["id"]
            ]
            assert deltas == args_done["arguments"] == item["arguments"] and args_done["name"] == item["name"]
    return final


def _create(client: openai.OpenAI, **kw: Any) -> tuple[dict[str, Any], Any]:
    raw = client.responses.with_raw_response.create(**kw)
    body = raw.http_response.json()
    assert_schema("Response", body)
    return body, raw


# ---- text ------------------------------------------------------------------------------------------------


def test_text_response_through_the_sdk(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    body, raw = _create(
        client,
        model=MODEL,
        instructions="You are terse.",
        input=_unique("Name a fruit."),
        max_output_tokens=16,
        temperature=0,
        metadata={"purpose": "test"},
        user="user-1",
    )
    resp = raw.parse()
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.status in ("completed", "incomplete")
    assert resp.output_text and resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.model == "SmolLM2-135M-Instruct" and resp.metadata == {"purpose": "test"} and resp.user == "user-1"
    assert resp.instructions == "You are terse." and resp.temperature == 0 and resp.store is True
    usage = resp.usage
    assert usage is not None and usage.input_tokens > 0 and 0 < usage.output_tokens <= 16
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert body["completed_at"] is not None or body["status"] == "incomplete"


def test_max_output_tokens_cut_is_incomplete(cache_stack: CacheStack) -> None:
    body, raw = _create(
        _client(cache_stack), model=MODEL, input=_unique("Write a long story about a dragon."), max_output_tokens=16
    )
    resp = raw.parse()
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens"
    assert resp.usage is not None and resp.usage.output_tokens == 16
    assert body["output"][0]["status"] == "incomplete"


def test_stream_events_follow_the_spec(cache_stack: CacheStack) -> None:
    body = {"model": MODEL, "input": _unique("Say hello to the reader."), "max_output_tokens": 24, "temperature": 0}
    _, events = _events(cache_stack.urls["memory"], body)
    final = _check_sequence(events)
    assert final["status"] in ("completed", "incomplete") and final["usage"]["output_tokens"] > 0
    assert len([e for e in events if e["type"] == "response.output_text.delta"]) > 1  # streamed, not in one piece
    types = [e["type"] for e in events]
    assert types[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert types[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    stored = httpx.get(f"{cache_stack.urls['memory']}/v1/responses/{final['id']}", headers=_headers()).json()
    assert stored == final


def test_sdk_stream_helper(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    # room to finish: a cut answer ends with response.incomplete, for which the SDK helper has no final response
    ask = _unique("Name two colors.")
    with client.responses.stream(model=MODEL, input=ask, max_output_tokens=200, temperature=0) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_text
    again = client.responses.retrieve(final.id)
    assert again.output_text == final.output_text and again.id == final.id


# ---- tools -----------------------------------------------------------------------------------------------


def test_function_call_then_its_output_with_previous_response_id(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    _, raw = _create(client, model=MODEL, input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required",
                        max_output_tokens=64, temperature=0)  # fmt: skip
    first = raw.parse()
    assert first.status == "completed"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert "city" in json.loads(call.arguments)
    output = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature_c": 21, "sky": "clear"}'}
    _, raw2 = _create(client, model=MODEL, previous_response_id=first.id, input=[output], tools=[WEATHER],
                          max_output_tokens=32, temperature=0)  # fmt: skip
    second = raw2.parse()
    assert second.previous_response_id == first.id and second.output_text
    assert second.usage is not None and first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the call and its output are in the prompt
    items = client.responses.input_items.list(second.id)
    assert [i.type for i in items.data] == ["function_call_output"]


def test_streamed_function_call(cache_stack: CacheStack) -> None:
    body = {"model": MODEL, "input": "What is the weather in Tokyo?", "tools": [WEATHER], "tool_choice": "required",
            "max_output_tokens": 64, "temperature": 0}  # fmt: skip
    _, events = _events(cache_stack.urls["memory"], body)
    final = _check_sequence(events)
    assert [i["type"] for i in final["output"]] == ["function_call"]
    assert any(e["type"] == "response.function_call_arguments.delta" for e in events)
    client = _client(cache_stack)
    with client.responses.stream(**{k: v for k, v in body.items()}) as stream:
        done = [e for e in stream if e.type == "response.function_call_arguments.done"]
        resp = stream.get_final_response()
    assert done and done[0].arguments == resp.output[0].arguments  # type: ignore[union-attr]


def test_named_tool_choice_and_none(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    forced = client.responses.create(model=MODEL, input="What time is it in Berlin?", tools=[WEATHER, TIME],
                                     tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=48,
                                     temperature=0)  # fmt: skip
    assert [(i.type, i.name) for i in forced.output] == [("function_call", "get_time")]  # type: ignore[union-attr]
    assert forced.tool_choice.name == "get_time"  # type: ignore[union-attr]
    plain = client.responses.create(model=MODEL, input="What time is it in Berlin?", tools=[WEATHER, TIME], tool_choice="none",
                                    max_output_tokens=16, temperature=0)  # fmt: skip
    assert [i.type for i in plain.output] == ["message"] and plain.output_text


def test_logprobs_when_included(cache_stack: CacheStack) -> None:
    url = cache_stack.urls["memory"]
    body = {"model": MODEL, "input": _unique("Name a color."), "max_output_tokens": 16, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": 2}  # fmt: skip
    resp = _post(url, body).json()
    assert_schema("Response", resp)
    part = resp["output"][0]["content"][0]
    assert 0 < len(part["logprobs"]) <= resp["usage"]["output_tokens"] and resp["top_logprobs"] == 2
    assert all(len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0 for lp in part["logprobs"])
    # the chat pipeline's logprobs include the end-of-turn token when the model stops (<|im_end|>), not in the text
    assert "".join(lp["token"] for lp in part["logprobs"]).startswith(part["text"])
    _, events = _events(url, body)
    final = _check_sequence(events)
    streamed = [lp for e in events if e["type"] == "response.output_text.delta" for lp in e["logprobs"]]
    assert streamed == final["output"][0]["content"][0]["logprobs"] and streamed


# ---- structured output -----------------------------------------------------------------------------------


class Person(BaseModel):
    name: str
    age: int


def test_json_schema_output(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}  # fmt: skip
    body, raw = _create(client, model=MODEL, input="Invent a person.", max_output_tokens=64, temperature=0,
                        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})  # fmt: skip
    data = json.loads(raw.parse().output_text)
    assert set(data) == {"name", "age"} and isinstance(data["age"], int)
    assert body["text"]["format"]["name"] == "person"
    parsed = client.responses.parse(
        model=MODEL, input="Invent a person.", text_format=Person, max_output_tokens=64, temperature=0
    )
    assert isinstance(parsed.output_parsed, Person)


def test_json_object_output(cache_stack: CacheStack) -> None:
    resp = _client(cache_stack).responses.create(model=MODEL, input="Give a JSON object describing a cat.", max_output_tokens=48,
                                                 temperature=0, text={"format": {"type": "json_object"}})  # fmt: skip
    if resp.status == "completed":
        assert isinstance(json.loads(resp.output_text), dict)
    else:
        assert resp.output_text.lstrip().startswith("{")


# ---- stored responses ------------------------------------------------------------------------------------


def test_retrieve_input_items_pagination_and_delete(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    url = cache_stack.urls["memory"]
    inputs = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hello!"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]},
        {"role": "user", "content": _unique("Name a planet.")},
    ]
    resp = client.responses.create(model=MODEL, input=inputs, max_output_tokens=16, temperature=0)  # type: ignore[arg-type]
    assert client.responses.retrieve(resp.id).model_dump() == resp.model_dump()
    listing = httpx.get(f"{url}/v1/responses/{resp.id}/input_items", headers=_headers()).json()
    assert_schema("ResponseItemList", listing)
    assert [i["role"] for i in listing["data"]] == ["user", "assistant", "user", "developer"]  # newest first
    asc = client.responses.input_items.list(resp.id, order="asc", limit=2)
    assert [i.role for i in asc.data] == ["developer", "user"] and asc.has_more  # type: ignore[union-attr]
    rest = client.responses.input_items.list(resp.id, order="asc", limit=2, after=asc.data[-1].id)
    assert [i.role for i in rest.data] == ["assistant", "user"] and not rest.has_more  # type: ignore[union-attr]
    assert [i.id for i in client.responses.input_items.list(resp.id, order="asc")] == [i["id"] for i in reversed(listing["data"])]
    deleted = httpx.delete(f"{url}/v1/responses/{resp.id}", headers=_headers())
    assert deleted.json() == {"id": resp.id, "object": "response", "deleted": True}
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(resp.id)


def test_store_false_is_not_kept(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    resp = client.responses.create(model=MODEL, input=_unique("Say yes."), max_output_tokens=16, store=False)
    assert resp.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model=MODEL, input="And then?", previous_response_id=resp.id, max_output_tokens=16)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_get_with_stream_replays_the_events(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    resp = client.responses.create(model=MODEL, input=_unique("Name an animal."), max_output_tokens=16, temperature=0)
    events = []
    url = f"{cache_stack.urls['memory']}/v1/responses/{resp.id}?stream=true"
    with httpx.stream("GET", url, headers=_headers(), timeout=TIMEOUT) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
                assert_schema("ResponseStreamEvent", events[-1])
    stored = httpx.get(f"{cache_stack.urls['memory']}/v1/responses/{resp.id}", headers=_headers()).json()
    assert _check_sequence(events) == stored


def test_previous_response_id_carries_the_conversation(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    first = client.responses.create(model=MODEL, input=_unique("My name is Ada."), max_output_tokens=16, temperature=0)
    second = client.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=16,
                                     temperature=0)  # fmt: skip
    counted = client.responses.input_tokens.count(model=MODEL, input="What is my name?", previous_response_id=first.id)
    assert second.usage is not None and first.usage is not None
    assert counted.input_tokens == second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    alone = client.responses.input_tokens.count(model=MODEL, input="What is my name?")
    assert alone.input_tokens < counted.input_tokens


def test_input_tokens_counts_what_generation_sees(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    kw = {"model": MODEL, "input": _unique("Count me."), "instructions": "Be brief.", "tools": [WEATHER]}
    counted = client.responses.input_tokens.count(**kw)  # type: ignore[arg-type]
    resp = client.responses.create(**kw, max_output_tokens=16, temperature=0)  # type: ignore[arg-type]
    assert resp.usage is not None and counted.input_tokens == resp.usage.input_tokens
    raw = httpx.post(f"{cache_stack.urls['memory']}/v1/responses/input_tokens", json=kw, headers=_headers()).json()
    assert_schema("TokenCountsResource", raw)


def test_truncation_auto_drops_the_oldest_turns(cache_stack: CacheStack) -> None:
    client = _client(cache_stack)
    filler = " ".join(["The quick brown fox jumps over the lazy dog."] * 60)  # ~600 tokens a turn
    turns: list[dict[str, Any]] = []
    for i in range(4):
        turns += [{"role": "user", "content": f"Note {i}: {filler}"}, {"role": "assistant", "content": "Noted."}]
    turns.append({"role": "user", "content": "Say OK."})
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input=turns, max_output_tokens=16)  # type: ignore[arg-type]
    assert err.value.body["param"] == "input" and err.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    resp = client.responses.create(model=MODEL, input=turns, max_output_tokens=16, truncation="auto")  # type: ignore[arg-type]
    assert resp.truncation == "auto" and resp.usage is not None and resp.usage.input_tokens + 16 <= 2048


# ---- tenants, replicas, the store down, the cache ----------------------------------------------------------


def test_another_tenant_can_neither_read_nor_continue(cache_stack: CacheStack) -> None:
    mine, theirs = _client(cache_stack), _client(cache_stack, key=OTHER_KEY)
    resp = mine.responses.create(model=MODEL, input=_unique("A private note."), max_output_tokens=16)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.retrieve(resp.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_items.list(resp.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.create(model=MODEL, input="Go on.", previous_response_id=resp.id, max_output_tokens=16)
    with pytest.raises(openai.NotFoundError):
        theirs.responses.input_tokens.count(model=MODEL, input="Go on.", previous_response_id=resp.id)
    assert mine.responses.retrieve(resp.id).id == resp.id  # still there for its owner


def test_redis_replicas_share_stored_responses(cache_stack: CacheStack) -> None:
    one, two = _client(cache_stack, "redis1"), _client(cache_stack, "redis2")
    resp = one.responses.create(model=MODEL, input=_unique("Name a river."), max_output_tokens=16)
    assert two.responses.retrieve(resp.id).output_text == resp.output_text
    follow = two.responses.create(model=MODEL, input="Another one?", previous_response_id=resp.id, max_output_tokens=16)
    assert one.responses.retrieve(follow.id).previous_response_id == resp.id
    with pytest.raises(openai.NotFoundError):
        _client(cache_stack, "redis2", key=OTHER_KEY).responses.retrieve(resp.id)
    two.responses.delete(resp.id)
    with pytest.raises(openai.NotFoundError):
        one.responses.retrieve(resp.id)


def test_store_down_still_answers(cache_stack: CacheStack) -> None:
    client = _client(cache_stack, "redis_down")
    resp = client.responses.create(model=MODEL, input=_unique("Say hi."), max_output_tokens=16)
    assert resp.output_text
    with pytest.raises(openai.InternalServerError) as err:
        client.responses.retrieve(resp.id)
    assert err.value.status_code == 503


def test_exact_cache_replays_in_the_responses_shape(cache_stack: CacheStack) -> None:
    url = cache_stack.urls["memory"]
    body = {"model": MODEL, "input": _unique("Name a tree."), "max_output_tokens": 16, "temperature": 0}
    first, second = _post(url, body), _post(url, body)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("miss", "hit")
    assert_schema("Response", second.json())
    assert second.json()["output"][0]["content"][0]["text"] == first.json()["output"][0]["content"][0]["text"]
    assert second.json()["id"] != first.json()["id"]
    headers, events = _events(url, body)
    assert headers["x-cache"] == "hit"
    assert _check_sequence(events)["output"][0]["content"][0]["text"] == first.json()["output"][0]["content"][0]["text"]
    assert _post(url, body, key=OTHER_KEY).headers["x-cache"] == "miss"  # another tenant's cache


# ---- what the gateway cannot do: 400s that name the field ----------------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "namespace", "name": "mcp", "tools": 3}]}, "tools[0].tools"),
    ({"tools": [{"type": "namespace", "name": "mcp", "tools": [{"type": "function"}]}]}, "tools[0].tools[0].name"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
    ({"reasoning": "high"}, "reasoning"),
    ({"background": True}, "background"),
    ({"conversation": "conv_123"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"max_output_tokens": 5}, "max_output_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"verbosity": "loud"}}, "text.verbosity"),
    ({"text": {"tone": "dry"}}, "text.tone"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice.name"),
    ({"truncation": "sometimes"}, "truncation"),
    ({"frequency_of_nonsense": 1}, "frequency_of_nonsense"),
    ({"input": 42}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]}, "input[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"include": ["reasoning.encrypted_content", "code_interpreter_call.outputs"]}, "include"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ({"metadata": {"k": 1}}, "metadata.k"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "param"), BAD, ids=[p for _, p in BAD])
def test_unsupported_or_bad_fields_are_400s_naming_them(cache_stack: CacheStack, change: dict[str, Any], param: str) -> None:
    body = {"model": MODEL, "input": "Hi.", "max_output_tokens": 16, **change}
    r = _post(cache_stack.urls["memory"], body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, error


def test_unknown_response_and_missing_model_and_bad_json(cache_stack: CacheStack) -> None:
    url = cache_stack.urls["memory"]
    r = httpx.get(f"{url}/v1/responses/resp_does_not_exist", headers=_headers())
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    assert _post(url, {"input": "hi"}).json()["error"]["param"] == "model"
    r = httpx.post(f"{url}/v1/responses", content=b"{not json", headers=_headers())
    assert r.status_code == 400
    r = httpx.get(f"{url}/v1/responses/resp_x/input_items?limit=0", headers=_headers())
    assert r.status_code in (400, 404)
    assert httpx.get(f"{url}/v1/responses/resp_x").status_code == 401


CODEX_LIKE = {**CODEX, "max_output_tokens": 16, "temperature": 0}


def test_codex_first_request_is_served(cache_stack: CacheStack) -> None:
    headers, events = _events(cache_stack.urls["memory"], CODEX_LIKE)
    assert headers["smolgate-tools-left-out"] == ",".join(CODEX_LEFT_OUT)
    done = _check_sequence(events)
    assert tuple(t["name"] for t in done["tools"]) == CODEX_OFFERED  # the namespace's function, by name
    assert done["text"]["verbosity"] == "low" and done["prompt_cache_key"] == CODEX_LIKE["prompt_cache_key"]
    more = [*CODEX_LIKE["input"], {"role": "user", "content": _unique("And a vegetable?")}]
    again = _post(cache_stack.urls["memory"], {**CODEX_LIKE, "input": more})
    assert again.status_code == 200, again.text
    assert again.json()["usage"]["input_tokens_details"]["cached_tokens"] > 0  # the same start: a prefix-cache hit
