"""Embeddings: all-MiniLM-L6-v2 through the SDK (base64 by default, and float), checked against
published sentence-transformers figures and against each other."""

from __future__ import annotations

import math

import gateway_fixtures
import httpx
import openai
import pytest
from gateway_fixtures import API_KEY, LiveStack, assert_schema

client = gateway_fixtures.client
live = gateway_fixtures.live


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(
        sum(x * x for x in a) * sum(y * y for y in b)
    )


def test_embeddings_base64_default_and_float_agree(client: openai.OpenAI) -> None:
    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The stock market fell sharply today.",
    ]
    b64 = client.embeddings.create(model="text-embedding-3-small", input=texts)  # SDK asks for base64
    flt = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    assert [d.index for d in b64.data] == [0, 1, 2]
    for a, b in zip(b64.data, flt.data, strict=True):
        assert len(a.embedding) == 384
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)
        assert math.sqrt(sum(x * x for x in a.embedding)) == pytest.approx(1.0, abs=1e-4)
    assert flt.model == "all-MiniLM-L6-v2" and flt.usage.prompt_tokens == flt.usage.total_tokens > 0
    food, bread, market = (d.embedding for d in flt.data)
    # sentence-transformers documents cos = 0.7553 for this pair with all-MiniLM-L6-v2
    assert _cos(food, bread) == pytest.approx(0.7553, abs=0.01)
    assert _cos(food, bread) > _cos(food, market) + 0.5


def test_embedding_response_shape(live: LiveStack) -> None:
    r = httpx.post(
        f"{live.url}/v1/embeddings",
        json={"model": "all-MiniLM-L6-v2", "input": "shape check"},
        headers={"authorization": f"Bearer {API_KEY}"},
    )
    assert r.status_code == 200
    assert_schema("CreateEmbeddingResponse", r.json())


def test_batch_order_is_preserved(client: openai.OpenAI) -> None:
    texts = [f"sentence number {i}" for i in range(40)]
    batch = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    single = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts[37], encoding_format="float")
    assert batch.data[37].embedding == pytest.approx(single.data[0].embedding, abs=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"input": [[1, 2, 3]]}, "input"),
        ({"input": []}, "input"),
        ({"input": "x", "dimensions": 128}, "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "word " * 600}, "input"),
    ],
)
def test_bad_embedding_requests(client: openai.OpenAI, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="all-MiniLM-L6-v2", **kwargs)
    assert info.value.response.json()["error"]["param"] == param
