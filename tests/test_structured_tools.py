"""Tool calling through the real OpenAI SDK and LangChain against a live server and the real engine."""

from __future__ import annotations

import json

import gateway_fixtures
import openai
from gateway_fixtures import API_KEY, LiveStack, assert_schema
from jsonschema import Draft202012Validator
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

client = gateway_fixtures.client
live = gateway_fixtures.live

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _call(client: openai.OpenAI, **kw: object) -> dict:
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", max_tokens=40, temperature=0, tools=TOOLS, **kw)  # type: ignore[call-overload]
    body = raw.http_response.json()
    assert_schema("CreateChatCompletionResponse", body)
    return body


def test_named_tool_choice_forces_a_valid_call(client: openai.OpenAI) -> None:
    body = _call(client, messages=ASK, tool_choice=NAMED, parallel_tool_calls=False)
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    Draft202012Validator(WEATHER).validate(json.loads(call["function"]["arguments"]))


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    first = _call(client, messages=ASK, tool_choice="required", parallel_tool_calls=False)
    message = first["choices"][0]["message"]
    call = message["tool_calls"][0]
    history = [
        *ASK,
        {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temperature": 18, "sky": "sunny"})},
    ]
    final = _call(client, messages=history, tool_choice="none")
    (choice,) = final["choices"]
    assert choice["message"]["content"] and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] in ("stop", "length")


def test_auto_answers_or_calls_in_openai_shape(client: openai.OpenAI) -> None:
    body = _call(client, messages=[{"role": "user", "content": "Say hello."}], tool_choice="auto")
    message = body["choices"][0]["message"]
    for call in message.get("tool_calls") or []:
        assert call["function"]["name"] in ("get_weather", "add")
        json.loads(call["function"]["arguments"])
    assert message["content"] or message.get("tool_calls")


def test_streamed_tool_calls_aggregate(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=40, temperature=0, stream=True
    )  # type: ignore[call-overload]
    calls: dict[int, dict] = {}
    reasons = []
    for chunk in stream:
        assert_schema("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert call["id"] is None
                    call["id"], call["name"] = d.id, d.function.name
                call["arguments"] += d.function.arguments or ""
    assert calls and reasons[-1] == "tool_calls"
    for call in calls.values():
        assert call["id"] and call["name"] in ("get_weather", "add")
        assert isinstance(json.loads(call["arguments"]), dict)


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(max_length=16)


def _llm(live: LiveStack) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{live.url}/v1", api_key=API_KEY, model="gpt-4o-mini", temperature=0, max_tokens=32, max_retries=0
    )


def test_langchain_bind_tools_forced(live: LiveStack) -> None:
    msg = _llm(live).bind_tools([GetWeather], tool_choice="GetWeather").invoke("Weather in Rome?")
    (call,) = msg.tool_calls
    assert call["name"] == "GetWeather" and isinstance(call["args"]["city"], str)
    GetWeather.model_validate(call["args"])


def test_langchain_streamed_tool_calls_aggregate(live: LiveStack) -> None:
    chunks = list(_llm(live).bind_tools([GetWeather], tool_choice="GetWeather").stream("Weather in Oslo?"))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged, AIMessageChunk)
    (call,) = merged.tool_calls
    assert call["name"] == "GetWeather"
    GetWeather.model_validate(call["args"])
