"""LangChain's ChatOpenAI pointed at the gateway: invoke, stream, batch, async, usage, stop."""

from __future__ import annotations

import gateway_fixtures
import pytest
from gateway_fixtures import API_KEY, LiveStack
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

live = gateway_fixtures.live

MESSAGES = [SystemMessage("You are terse."), HumanMessage("Name a fruit.")]


@pytest.fixture()
def llm(live: LiveStack) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{live.url}/v1",
        api_key=API_KEY,
        model="gpt-4o-mini",
        temperature=0,
        max_tokens=8,
        max_retries=0,
    )


def test_invoke_with_usage_metadata(llm: ChatOpenAI) -> None:
    msg = llm.invoke(MESSAGES)
    assert msg.content
    usage = msg.usage_metadata
    assert usage is not None and usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 8
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert msg.response_metadata["model_name"] == "SmolLM2-135M-Instruct"
    assert msg.response_metadata["finish_reason"] in ("stop", "length")


def test_stream_matches_invoke(llm: ChatOpenAI) -> None:
    full = llm.invoke(MESSAGES).content
    chunks = list(llm.stream(MESSAGES, stream_usage=True))
    assert "".join(c.content for c in chunks) == full
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert merged.usage_metadata is not None and merged.usage_metadata["output_tokens"] > 0


def test_batch(llm: ChatOpenAI) -> None:
    questions = [[HumanMessage(f"Say the number {i}.")] for i in range(3)]
    results = llm.batch(questions)
    assert len(results) == 3 and all(r.content for r in results)


async def test_ainvoke_and_astream(llm: ChatOpenAI) -> None:
    msg = await llm.ainvoke(MESSAGES)
    assert msg.content and msg.usage_metadata["output_tokens"] > 0
    text = "".join([c.content async for c in llm.astream(MESSAGES)])
    assert text == msg.content


def test_stop_sequences(llm: ChatOpenAI) -> None:
    full = llm.invoke(MESSAGES).content
    assert len(full) > 3
    stop = full[2:4]
    cut = llm.invoke(MESSAGES, stop=[stop]).content
    assert stop not in cut and full.startswith(cut)


def test_max_completion_tokens_is_honoured(live: LiveStack) -> None:
    llm = ChatOpenAI(
        base_url=f"{live.url}/v1",
        api_key=API_KEY,
        model="gpt-4o-mini",
        max_completion_tokens=3,
        max_retries=0,
    )
    msg = llm.invoke([HumanMessage("Tell me a long story.")])
    assert msg.usage_metadata["output_tokens"] <= 3
