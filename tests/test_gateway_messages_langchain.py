"""LangChain's ChatAnthropic pointed at the gateway's /v1/messages: invoke, stream, bind_tools, usage, stop."""

from __future__ import annotations

from typing import Any

import gateway_fixtures
import pytest
from gateway_fixtures import API_KEY, LiveStack
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from pydantic import BaseModel, Field

live = gateway_fixtures.live

MODEL = "SmolLM2-135M-Instruct"
MESSAGES = [SystemMessage("You are terse."), HumanMessage("Name a fruit.")]


class GetWeather(BaseModel):
    """Current weather in a city."""

    city: str = Field(description="The city", max_length=16)


def _llm(live: LiveStack, **kw: Any) -> ChatAnthropic:
    kw.setdefault("max_tokens", 12)
    # greedy, so invoke and stream can be compared (the current SDK's types have no temperature: model_kwargs
    # would hand it to messages.create as an unknown argument, extra_body sends it as JSON)
    kw.setdefault("model_kwargs", {"extra_body": {"temperature": 0}})
    return ChatAnthropic(model=MODEL, base_url=live.url, api_key=API_KEY, max_retries=0, **kw)  # type: ignore[call-arg]


@pytest.fixture()
def llm(live: LiveStack) -> ChatAnthropic:
    return _llm(live)


def test_invoke_with_usage_metadata(llm: ChatAnthropic) -> None:
    msg = llm.invoke(MESSAGES)
    assert isinstance(msg.content, str) and msg.content
    usage = msg.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 12
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert msg.response_metadata["stop_reason"] in ("end_turn", "max_tokens")
    assert msg.response_metadata["model"] == MODEL and msg.response_metadata["id"].startswith("msg_")


def test_stream_matches_invoke(llm: ChatAnthropic) -> None:
    full = llm.invoke(MESSAGES)
    chunks = list(llm.stream(MESSAGES))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert merged.text == full.text
    assert merged.usage_metadata is not None
    assert merged.usage_metadata["input_tokens"] == full.usage_metadata["input_tokens"]
    assert merged.usage_metadata["output_tokens"] == full.usage_metadata["output_tokens"]


async def test_ainvoke_and_astream(llm: ChatAnthropic) -> None:
    msg = await llm.ainvoke(MESSAGES)
    text = "".join([c.text async for c in llm.astream(MESSAGES)])
    assert text == msg.text


def test_stop_sequences(llm: ChatAnthropic) -> None:
    full = llm.invoke(MESSAGES).text
    assert len(full) > 3
    stop = full[2:4]
    cut = llm.invoke(MESSAGES, stop=[stop])
    assert cut.text == full[: full.index(stop)]
    assert cut.response_metadata["stop_reason"] == "stop_sequence" and cut.response_metadata["stop_sequence"] == stop


def test_bind_tools_forced_and_round_trip(live: LiveStack) -> None:
    llm = _llm(live, max_tokens=40).bind_tools([GetWeather], tool_choice="GetWeather")
    ask = [HumanMessage("What is the weather in Paris?")]
    msg = llm.invoke(ask)
    assert isinstance(msg, AIMessage)
    (call,) = msg.tool_calls
    assert call["name"] == "GetWeather" and isinstance(call["args"]["city"], str) and call["id"].startswith("toolu_")
    GetWeather(**call["args"])
    answer = (
        _llm(live, max_tokens=16)
        .bind_tools([GetWeather])
        .invoke([*ask, msg, ToolMessage("18 degrees and sunny", tool_call_id=call["id"])])
    )
    assert answer.content


def test_bind_tools_stream_aggregates_the_same_call(live: LiveStack) -> None:
    llm = _llm(live, max_tokens=40).bind_tools([GetWeather], tool_choice="any")
    ask = [HumanMessage("What is the weather in Paris?")]
    whole = llm.invoke(ask)
    merged: AIMessageChunk | None = None
    for chunk in llm.stream(ask):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    (call,) = merged.tool_calls
    assert call["name"] == "GetWeather" and call["args"] == whole.tool_calls[0]["args"]
    assert merged.response_metadata.get("stop_reason") == "tool_use"


class Fruit(BaseModel):
    """A fruit."""

    # no max_length: langchain-anthropic (1.7 here) moves it into the description, as Anthropic's structured outputs
    # have no maxLength, so the grammar cannot hold the model to it and the SDK's validation would fail instead
    name: str = Field(description="the fruit's name")


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output(live: LiveStack, method: str) -> None:
    structured = _llm(live, max_tokens=40).with_structured_output(Fruit, method=method)
    fruit = structured.invoke([HumanMessage("Name a fruit.")])
    assert isinstance(fruit, Fruit) and fruit.name
