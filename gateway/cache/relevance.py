"""Answer-conditioned relevance: does the cached answer relate to the new question as well as it related to the
question it was written for?

A look-alike question ("what is the area of peru" for a cached "what is the population of peru") embeds close to
the cached question, but the cached answer talks about what the *cached* question asked (people, millions), so it
sits further from the look-alike than from its own question. A paraphrase asks the same thing, and the answer is as
close to it as to the original. The check needs only the sentence embedder (no engine), so it also works for
models the engine cannot score.

When an answer is stored, its opening words are embedded once and kept with the entry together with
cos(original question, answer). A semantic candidate is then served only if

    cos(new question, answer) >= cos(original question, answer) - margin

(`cache.relevance_margin`, calibrated on tests/data/cache_pairs/dev.tsv with `python -m bench.cache_pairs
--calibrate`). Vectors are unit length, so each cosine is one dot product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Only the answer's opening is embedded: it is where an answer restates what it answers, it keeps the embedding
# within what MiniLM reads (256 word pieces), and it makes a short answer and a long one for the same question
# comparable. The calibration embeds the same excerpt of answers generated to 64 tokens.
ANSWER_WORDS = 48


def excerpt(answer: str) -> str:
    """The part of an answer that is embedded: its first ANSWER_WORDS words."""
    return " ".join(answer.split()[:ANSWER_WORDS])


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Dot product of two unit vectors."""
    return float(sum(x * y for x, y in zip(a, b, strict=True)))


@dataclass(frozen=True)
class AnswerVector:
    """The embedded answer excerpt, and its cosine with the question the answer was generated for."""

    vector: tuple[float, ...]
    question_cos: float

    def to_json(self) -> dict[str, Any]:
        # 4 decimals: the check compares cosines whose margins are hundredths, and the entry stays ~3 KB smaller
        return {"v": [round(x, 4) for x in self.vector], "qc": round(self.question_cos, 5)}

    @staticmethod
    def from_json(raw: object) -> AnswerVector | None:
        if not isinstance(raw, dict):
            return None
        vec, qc = raw.get("v"), raw.get("qc")
        if not isinstance(vec, list) or not vec or not isinstance(qc, (int, float)):
            return None
        return AnswerVector(tuple(float(x) for x in vec), float(qc))

    @staticmethod
    def of(answer_vector: Sequence[float], question_vector: Sequence[float]) -> AnswerVector:
        return AnswerVector(tuple(answer_vector), cosine(answer_vector, question_vector))


def relevant(new_question: Sequence[float], answer: AnswerVector, margin: float) -> bool:
    """Whether the cached answer relates to the new question at most `margin` less than to its own question."""
    if len(new_question) != len(answer.vector):  # another embedder wrote it: nothing to compare, not served
        return False
    return passes(cosine(new_question, answer.vector), answer.question_cos, margin)


def passes(new_cos: float, question_cos: float, margin: float) -> bool:
    """The criterion on the two cosines (bench.cache_pairs scores recorded cosines with it)."""
    return new_cos >= question_cos - margin
