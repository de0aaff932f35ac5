"""Real clients that speak the Responses API, pointed at the gateway: the OpenAI Agents SDK's Runner loop
with a function tool, and LangChain's ChatOpenAI(use_responses_api=True) (invoke, stream, tool calls)."""

from __future__ import annotations

import cache_fixtures
import openai
import pytest
from cache_fixtures import CacheStack
from gateway_fixtures import API_KEY

cache_stack = cache_fixtures.cache_stack

agents = pytest.importorskip("agents")
langchain_openai = pytest.importorskip("langchain_openai")


def _agents_model(cache_stack: CacheStack) -> agents.OpenAIResponsesModel:
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{cache_stack.urls['memory']}/v1", api_key=API_KEY, max_retries=0, timeout=600)
    return agents.OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)


async def test_agents_runner_calls_the_tool_and_finishes(cache_stack: CacheStack) -> None:
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return f"It is sunny and 21 degrees in {city}."

    agent = agents.Agent(
        name="weather",
        instructions="You answer weather questions using the get_weather tool.",
        tools=[get_weather],
        model=_agents_model(cache_stack),
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
        tool_use_behavior="stop_on_first_tool",
    )
    result = await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=3)
    assert calls and result.final_output == f"It is sunny and 21 degrees in {calls[0]}."
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds


async def test_agents_runner_full_loop_answers_after_the_tool(cache_stack: CacheStack) -> None:
    """The model calls the tool (forced on the first turn), gets its output back through the next
    /v1/responses request, and answers in text (tool_choice goes back to auto after a tool call)."""
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        calls.append(city)
        return "sunny, 21 degrees"

    agent = agents.Agent(
        name="weather",
        instructions="Answer weather questions. After the tool result, reply in one sentence.",
        tools=[get_weather],
        model=_agents_model(cache_stack),
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=48),
    )
    try:
        result = await agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4)
    except agents.MaxTurnsExceeded:  # a 135M model may keep calling the tool; the loop itself worked
        assert len(calls) >= 2
        return
    assert calls and isinstance(result.final_output, str) and result.final_output
    assert len(result.raw_responses) >= 2


async def test_agents_runner_streamed(cache_stack: CacheStack) -> None:
    agent = agents.Agent(
        name="plain",
        instructions="You are terse.",
        model=_agents_model(cache_stack),
        model_settings=agents.ModelSettings(temperature=0, max_tokens=24),
    )
    run = agents.Runner.run_streamed(agent, "Name a color.")
    events = [e async for e in run.stream_events() if e.type == "raw_response_event"]
    deltas = [e.data.delta for e in events if e.data.type == "response.output_text.delta"]
    assert "".join(deltas) == run.final_output and run.final_output


def _chat(cache_stack: CacheStack, **kw: object) -> langchain_openai.ChatOpenAI:
    return langchain_openai.ChatOpenAI(
        base_url=f"{cache_stack.urls['memory']}/v1",
        api_key=API_KEY,
        model="gpt-4o-mini",
        temperature=0,
        max_retries=0,
        timeout=600,
        use_responses_api=True,
        **{"max_tokens": 24, **kw},  # type: ignore[arg-type]
    )


def test_langchain_invoke_and_stream(cache_stack: CacheStack) -> None:
    llm = _chat(cache_stack)
    msg = llm.invoke("Name a fruit.")
    assert msg.text and msg.response_metadata["id"].startswith("resp_")
    assert msg.usage_metadata is not None and msg.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream("Name a fruit."))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert merged.text == msg.text


def test_langchain_tool_calls(cache_stack: CacheStack) -> None:
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "sunny"

    llm = _chat(cache_stack, max_tokens=64).bind_tools([get_weather], tool_choice="get_weather")
    msg = llm.invoke("What is the weather in Paris?")
    (call,) = msg.tool_calls
    assert call["name"] == "get_weather" and "city" in call["args"]
    streamed = None
    for chunk in llm.stream("What is the weather in Rome?"):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed is not None and [c["name"] for c in streamed.tool_calls] == ["get_weather"]
