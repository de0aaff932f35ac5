"""`model: "auto"`: score a request's difficulty in [0, 1] and pick the small or the large model.

Two signals: cheap features of the text (length, code, math, reasoning verbs, turns) always, and,
when an embedder is available, a k-nearest-neighbours vote over labelled example prompts
(all-MiniLM-L6-v2 puts "prove that..." near other proofs and "hi!" near other greetings).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gateway.client import EmbeddingClient

# (prompt, label): 0 = a small model answers it well, 1 = it needs the large one.
EXAMPLES: tuple[tuple[str, int], ...] = (
    ("Hi!", 0),
    ("Hello, how are you today?", 0),
    ("What is the capital of France?", 0),
    ("Translate 'good morning' into Spanish.", 0),
    ("Give me a synonym for happy.", 0),
    ("What day comes after Monday?", 0),
    ("Tell me a short joke.", 0),
    ("Is a tomato a fruit?", 0),
    ("What color is the sky?", 0),
    ("Say thanks in French.", 0),
    ("How many legs does a spider have?", 0),
    ("Spell the word necessary.", 0),
    ("Prove that there are infinitely many prime numbers.", 1),
    ("Design a distributed rate limiter that works across data centers and explain the trade-offs.", 1),
    ("Write a Python function that finds the longest palindromic substring in O(n) time and explain why it works.", 1),
    ("Analyze the causes of the 2008 financial crisis and compare them with the Great Depression.", 1),
    ("Derive the closed form of the Fibonacci sequence using generating functions.", 1),
    ("Refactor this code to remove the race condition and explain the memory model involved.", 1),
    ("Explain step by step how backpropagation computes gradients in a transformer.", 1),
    ("Compare three consensus algorithms and recommend one for a 5-node cluster with flaky links.", 1),
    ("Solve the integral of x^2 * e^x dx and verify the result by differentiation.", 1),
    ("Debug why my Kubernetes pods restart every few minutes given these logs and a memory limit of 256Mi.", 1),
    ("Write a legal analysis of whether a non-compete clause is enforceable in California.", 1),
    ("Plan a database migration from MySQL to PostgreSQL with zero downtime.", 1),
)

_HARD_WORDS = re.compile(
    r"\b(prove|proof|derive|analy[sz]e|compare|design|architect|optimi[sz]e|algorithm|complexity|refactor|debug|"
    r"explain (why|how)|step by step|trade-?offs?|theorem|integral|derivative|implement|evaluate|critique)\b",
    re.IGNORECASE,
)
_CODE = re.compile(r"```|\bdef |\bclass |\breturn\b|[{};]\s*$|=>|#include", re.MULTILINE)
_MATH = re.compile(r"[=^∫∑√≤≥]|\d+\s*[*/+-]\s*\d+")


def feature_score(text: str, turns: int) -> float:
    """Difficulty from surface features alone, in [0, 1]."""
    length = min(1.0, math.log1p(len(text)) / math.log1p(2000))  # ~2000 chars and up: long
    hard = min(1.0, len(_HARD_WORDS.findall(text)) / 2)
    code = 1.0 if _CODE.search(text) else 0.0
    math_ = min(1.0, len(_MATH.findall(text)) / 3)
    multi = min(1.0, (turns - 1) / 6)
    return min(1.0, 0.35 * length + 0.35 * hard + 0.2 * code + 0.15 * math_ + 0.1 * multi)


def request_text(body: dict[str, Any]) -> tuple[str, int]:
    """The last user message (chat) or the prompt (completions), and the number of turns."""
    messages = body.get("messages")
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        content = users[-1].get("content", "") if users else ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content), len(users)
    prompt = body.get("prompt", "")
    return (prompt if isinstance(prompt, str) else str(prompt)[:2000]), 1


@dataclass(frozen=True)
class AutoChoice:
    model: str
    score: float
    tier: str  # "small" | "large"


class AutoRouter:
    def __init__(self, small: str, large: str, threshold: float, embedder: EmbeddingClient | None, *, k: int = 5) -> None:
        self.small, self.large, self.threshold = small, large, threshold
        self.embedder = embedder
        self.k = k
        self._examples: list[tuple[list[float], int]] | None = None

    async def _knn(self, text: str) -> float | None:
        if self.embedder is None:
            return None
        try:
            if self._examples is None:
                vectors, _ = await self.embedder.embed([p for p, _ in EXAMPLES])
                self._examples = [(v, label) for v, (_, label) in zip(vectors, EXAMPLES, strict=True)]
            (query,), _ = await self.embedder.embed([text[:2000]])
        except Exception:
            return None  # no embedder right now: the features decide alone
        sims = sorted(((sum(a * b for a, b in zip(query, v, strict=True)), label) for v, label in self._examples), reverse=True)
        top = sims[: self.k]
        weights = [max(s, 1e-3) for s, _ in top]
        return sum(w * label for w, (_, label) in zip(weights, top, strict=True)) / sum(weights)

    async def choose(self, body: dict[str, Any]) -> AutoChoice:
        text, turns = request_text(body)
        score = feature_score(text, turns)
        knn = await self._knn(text)
        if knn is not None:
            score = 0.5 * score + 0.5 * knn
        tier = "large" if score >= self.threshold else "small"
        return AutoChoice(self.large if tier == "large" else self.small, round(score, 3), tier)
