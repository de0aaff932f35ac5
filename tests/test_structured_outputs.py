"""response_format json_object / json_schema through the real OpenAI SDK, LangChain and a live server."""

from __future__ import annotations

import asyncio
import json

import gateway_fixtures
import openai
import pytest
from gateway_fixtures import API_KEY, LiveStack, assert_schema
from jsonschema import Draft202012Validator
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

client = gateway_fixtures.client
live = gateway_fixtures.live

SCHEMAS: dict[str, dict] = {
    "flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 2, "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum_bool": {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad", "calm"]}, "tired": {"type": "boolean"}},
        "required": ["mood", "tired"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 999},
                    "city": {"type": "string", "maxLength": 12},
                },
                "required": ["id", "city"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "number_range": {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 10}, "unit": {"const": "pts"}},
        "required": ["score", "unit"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "maxLength": 5},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
}


def _ask(schema_name: str) -> list[dict]:
    return [{"role": "user", "content": f"Reply with a short JSON object for '{schema_name}'."}]


async def test_many_schemas_validate(live: LiveStack) -> None:
    """All schemas at once (one continuous batch); every output parses and validates."""
    aclient = live.async_client()

    async def one(name: str, schema: dict) -> tuple[str, str, str | None]:
        rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        resp = await aclient.chat.completions.create(
            model="gpt-4o-mini", messages=_ask(name), response_format=rf, max_tokens=64, temperature=0
        )
        return name, resp.choices[0].message.content or "", resp.choices[0].finish_reason

    results = await asyncio.gather(*(one(n, s) for n, s in SCHEMAS.items()))
    for name, text, reason in results:
        assert reason == "stop", (name, text)
        Draft202012Validator(SCHEMAS[name]).validate(json.loads(text))


def test_json_object_and_shape(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Give a JSON object with a key 'a'."}],
        response_format={"type": "json_object"},
        max_tokens=24,
        temperature=0,
    )
    assert_schema("CreateChatCompletionResponse", raw.http_response.json())
    assert raw.parse().choices[0].message.content.startswith("{")


class Pet(BaseModel):
    name: str = Field(max_length=10)
    species: str = Field(max_length=10)
    legs: int = Field(ge=0, le=8)


def test_sdk_parse_returns_the_pydantic_object(client: openai.OpenAI) -> None:
    resp = client.chat.completions.parse(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Describe a pet cat as JSON."}],
        response_format=Pet,
        max_tokens=48,
        temperature=0,
    )
    pet = resp.choices[0].message.parsed
    assert isinstance(pet, Pet) and 0 <= pet.legs <= 8


def test_streamed_json_schema_and_n(client: openai.OpenAI) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "flat", "schema": SCHEMAS["flat"]}}
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=_ask("person"), response_format=rf, max_tokens=128, n=2, temperature=0.7, seed=1,
        stream=True,
    )
    texts = {0: "", 1: ""}
    for chunk in stream:
        assert_schema("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    for text in texts.values():
        Draft202012Validator(SCHEMAS["flat"]).validate(json.loads(text))


def test_langchain_with_structured_output_json_schema(live: LiveStack) -> None:
    llm = ChatOpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, model="gpt-4o-mini", temperature=0, max_tokens=48, max_retries=0)
    pet = llm.with_structured_output(Pet, method="json_schema").invoke("Describe a pet dog as JSON.")
    assert isinstance(pet, Pet)


@pytest.mark.parametrize(
    ("response_format", "needle"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}}, "not"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {"type": "string"}, "then": {}}}}, "if"),
        ({"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}, "name"),
        ({"type": "xml"}, "xml"),
    ],
)
def test_unsupported_response_formats_are_400(client: openai.OpenAI, response_format: dict, needle: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=_ask("x"),
            response_format=response_format,
            max_tokens=4,  # type: ignore[arg-type]
        )
    assert needle in err.value.message
