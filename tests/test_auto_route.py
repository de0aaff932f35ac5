"""gateway/routing/auto.py: `model: auto` scores difficulty from features and, with the real all-MiniLM-L6-v2,
from labelled examples; easy questions go to the small model, hard ones to the large."""

from __future__ import annotations

from gateway.routing.auto import AutoRouter, feature_score, request_text

EASY = ["Hi there!", "What is the capital of Italy?", "Say hello in German."]
HARD = [
    "Prove that the square root of 2 is irrational, step by step.",
    "Design a sharded job queue with exactly-once delivery and analyze the failure modes and trade-offs.",
    "Write a Python function implementing Dijkstra's algorithm with a heap and explain its complexity.",
]


def _chat(text: str) -> dict[str, object]:
    return {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]}


def test_features_alone_separate_easy_from_hard() -> None:
    assert max(feature_score(t, 1) for t in EASY) < min(feature_score(t, 1) for t in HARD)
    assert request_text(_chat("hello")) == ("hello", 1)
    assert request_text({"prompt": "complete me"}) == ("complete me", 1)


async def test_auto_with_the_real_embedder() -> None:
    from backend.embed.embeddings import Embedder

    router = AutoRouter("small", "large", 0.45, Embedder())
    easy = [await router.choose(_chat(t)) for t in EASY]
    hard = [await router.choose(_chat(t)) for t in HARD]
    assert [c.model for c in easy] == ["small"] * 3, easy
    assert [c.model for c in hard] == ["large"] * 3, hard
    assert all(0.0 <= c.score <= 1.0 for c in easy + hard)
