"""The learned matcher: does any correct answer to one question answer the other? (`cache.semantic_match: learned`)

A small head over all-MiniLM-L6-v2's token-level states of both questions (the encoder the cache already runs,
backend/embed/embeddings.py `token_states`), with MiniLM's top two layers fine-tuned for this task
(backend/embed/tuned.py, `matcher_encoder.safetensors`): stock MiniLM ranks a question's look-alikes above its
rewordings in another style, and no head over its states undid that. In `learned` and `union` modes the cache's index
holds that encoder's vectors too. The head reads a fixed vector of features of the pair:

- the alignment matrix: the cosine of every word-piece of one question with every word-piece of the other; for each
  piece its best partner in the other question, then, per direction, the weakest, the mean and how many fall below
  a few levels (a sibling swap, an antonym or an added condition leaves one piece without a good partner);
  the same for the pieces that have no identical piece in the other question (what was reworded), and the same
  alignment over the pieces' rows of the word-embedding table (out of context, "cat" and "dog" stay apart where
  their contextual states, in one sentence, come close);
- pooled: the cosine of the sentence vectors (what found the candidate) and of the mean content-piece states;
- the surface: lengths, word overlap;
- the hand-written signals, as inputs, not as a gate: the key-term guards (numbers, operators, names, opposed
  polarity words: gateway/cache/guards.py), the lexical check's verdict (gateway/cache/lexical.py, WordNet), and
  whether the negations and the numbers differ.

Every directional statistic comes in as (min, max) over the two directions, so the features, and the score, are
the same whichever question is the cached one. The head (one-hidden-layer networks from a few seeds, averaged;
numpy only: the gateway never imports torch) and its serving threshold ship in `matcher.json`, trained and calibrated by
`python -m gateway.cache.train` (docs/caching.md "The learned matcher").
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from backend.embed.digest import file_digest
from gateway.cache import lexical
from gateway.cache.guards import same_key_terms

MODEL_PATH = Path(__file__).with_name("matcher.json")
# MiniLM's top layers fine-tuned for this task (backend/embed/tuned.py): the heads read its token states
ENCODER_PATH = Path(__file__).with_name("matcher_encoder.safetensors")
MEMO = 2048  # cached questions whose token states are kept (~37 KB each: ~75 MB); others are encoded when met
LEVELS = (0.4, 0.5, 0.6, 0.7, 0.8)
VERDICTS = (lexical.SAME, lexical.REORDERED, lexical.SWAPPED, lexical.SUBSTITUTED, lexical.DIFFERENT)
_WORD = re.compile(r"[a-z0-9]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_NEGATIONS = frozenset({"not", "no", "never", "without", "none", "nothing", "nobody", "neither", "nor", "cannot",
                        "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont", "shouldnt",
                        "couldnt", "wouldnt", "hasnt", "havent", "aint"})  # fmt: skip

# (word pieces, their final hidden states: float32 (pieces, dimensions), the text's unit sentence vector, the pieces'
# word-embedding rows: (pieces, dimensions))
TokenStates = tuple[list[str], np.ndarray, list[float], np.ndarray]


@runtime_checkable  # isinstance checks for token_states only: the cache's embedder may lack it
class TokenEmbedder(Protocol):
    """What the matcher needs of the cache's embedder (backend/embed/embeddings.py Embedder.token_states)."""

    async def token_states(self, texts: list[str]) -> list[TokenStates]: ...


@dataclass(frozen=True)
class Question:
    """One question as the matcher reads it: its word pieces with unit-norm states (pieces with a letter or digit
    only), its lowercase words, and its sentence vector (the one the index holds)."""

    pieces: tuple[str, ...]
    states: np.ndarray  # (pieces, dimensions), rows of unit norm
    words: tuple[str, ...]
    vector: list[float]
    static: np.ndarray  # the pieces' word-embedding rows, unit norm: what each piece means out of context

    @classmethod
    def of(cls, text: str, tokens: TokenStates) -> Question:
        pieces, states, vector, static = tokens
        keep = [i for i, p in enumerate(pieces) if any(ch.isalnum() for ch in p)]
        if not keep:  # punctuation only: keep everything rather than nothing
            keep = list(range(len(pieces)))
        words = tuple(_WORD.findall(text.lower().replace("'", "").replace("’", "")))
        return cls(tuple(pieces[i] for i in keep), _unit(states, keep), words, list(vector), _unit(static, keep))


def _unit(rows: np.ndarray, keep: list[int]) -> np.ndarray:
    """Unit rows, kept in float32 (a cached question's two matrices are ~37 KB so); `features` computes in float64."""
    kept = np.asarray(rows, dtype=np.float64)[keep] if keep else np.zeros((0, 1))
    unit: np.ndarray = (kept / np.maximum(np.linalg.norm(kept, axis=1, keepdims=True), 1e-9)).astype(np.float32)
    return unit


def _directional(best: np.ndarray) -> list[float]:
    """Statistics of each piece's best cosine in the other question."""
    if best.size == 0:
        return [0.0, 0.0, 0.0] + [1.0] * len(LEVELS) + [1.0] * len(LEVELS)
    ordered = np.sort(best)
    second = ordered[1] if ordered.size > 1 else ordered[0]
    below = [float(np.mean(best < t)) for t in LEVELS]
    counts = [min(float(np.sum(best < t)), 3.0) / 3.0 for t in LEVELS]
    return [float(ordered[0]), float(second), float(best.mean()), *below, *counts]


def _reworded(a: Question, b: Question, best: np.ndarray) -> list[float]:
    """The best cosines of the pieces of `a` that have no identical piece in `b`."""
    others = set(b.pieces)
    mask = np.array([p not in others for p in a.pieces], dtype=bool)
    picked = best[mask] if mask.size else best[:0]
    share = float(mask.mean()) if mask.size else 0.0
    if picked.size == 0:
        return [share, 1.0, 1.0]
    return [share, float(picked.min()), float(picked.mean())]


def _sym(x: list[float], y: list[float]) -> list[float]:
    return [v for a, b in zip(x, y, strict=True) for v in (min(a, b), max(a, b))]


def norm(text: str) -> str:
    """Lowercase words, punctuation dropped: how the pair files' questions are compared (gateway/cache/train.py)."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


# What may end or open a word without changing it: sentence punctuation and quotes. Everything else stays, inside a
# word or at its ends ("c++" / "c", "-5" / "5", "5%" / "5", "1,000" / "1.000", "it's" / "its" are other words).
_FRAME = ".,;:!?\"'()[]{}¿¡‘’“”"


def style_free(text: str) -> tuple[str, ...]:
    """The words of `text` in order, lowercase, without the sentence punctuation around them."""
    words = (w.strip(_FRAME) for w in text.lower().replace("’", "'").split())
    return tuple(w for w in words if w)


def scored(head: Ensemble, rows: np.ndarray, query: str, cached: list[str]) -> np.ndarray:
    """The heads' scores, and 1 for a cached question with the query's words in its order (capitals and the
    punctuation around words aside: `style_free`): the same question, whatever the heads say (they score such a pair
    below the threshold about a fifth of the time: no labelled pair is one)."""
    words = style_free(query)
    same = np.array([style_free(c) == words for c in cached])
    return np.where(same, 1.0, head.scores(rows))


def _numbers(text: str) -> list[str]:
    return _NUMBER.findall(text)


def _negations(words: tuple[str, ...], text: str) -> int:
    return sum(w in _NEGATIONS for w in words) + text.lower().count("n't") + text.lower().count("n’t")


def features(query: str, cached: str, qa: Question, qb: Question, *, similarity: float) -> np.ndarray:
    """The pair's feature vector (float64; see the module docstring). `similarity`: the cosine of the two
    questions' sentence vectors, as the index found the candidate."""
    a_states, b_states = qa.states.astype(np.float64), qb.states.astype(np.float64)
    sims = a_states @ b_states.T if qa.states.size and qb.states.size else np.zeros((1, 1))
    best_a, best_b = sims.max(axis=1), sims.max(axis=0)
    align = _sym(_directional(best_a), _directional(best_b))
    a_static, b_static = qa.static.astype(np.float64), qb.static.astype(np.float64)
    words = a_static @ b_static.T if qa.static.size and qb.static.size else np.zeros((1, 1))
    static = _sym(_directional(words.max(axis=1)), _directional(words.max(axis=0)))
    reworded = _sym(_reworded(qa, qb, best_a), _reworded(qb, qa, best_b))
    mean_a, mean_b = a_states.mean(axis=0), b_states.mean(axis=0)
    pooled = float(mean_a @ mean_b / max(np.linalg.norm(mean_a) * np.linalg.norm(mean_b), 1e-9))
    wa, wb = set(qa.words), set(qb.words)
    overlap = len(wa & wb)
    surface = [
        np.log1p(min(len(qa.pieces), len(qb.pieces))), np.log1p(max(len(qa.pieces), len(qb.pieces))),
        abs(len(qa.pieces) - len(qb.pieces)) / max(len(qa.pieces), len(qb.pieces), 1),
        overlap / max(len(wa | wb), 1), *sorted((overlap / max(len(wa), 1), overlap / max(len(wb), 1))),
    ]  # fmt: skip
    verdict = lexical.compare(query, cached)
    signals = [
        float(same_key_terms(query, cached)),
        *(float(verdict == v) for v in VERDICTS),
        float((_negations(qa.words, query) > 0) != (_negations(qb.words, cached) > 0)),
        float(sorted(_numbers(query)) != sorted(_numbers(cached))),
    ]
    return np.array([similarity, pooled, *align, *reworded, *surface, *signals, *static], dtype=np.float64)


@dataclass(frozen=True)
class Head:
    """A one-hidden-layer network over standardised features: p = sigmoid(w2 . tanh(W1 z + b1) + b2)."""

    mean: np.ndarray
    scale: np.ndarray
    w1: np.ndarray  # (hidden, features)
    b1: np.ndarray
    w2: np.ndarray  # (hidden,)
    b2: float

    def scores(self, x: np.ndarray) -> np.ndarray:
        z = (np.atleast_2d(x) - self.mean) / self.scale
        logits = np.tanh(z @ self.w1.T + self.b1) @ self.w2 + self.b2
        probabilities: np.ndarray = 1.0 / (1.0 + np.exp(-logits))
        return probabilities

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "scale": self.scale.tolist(), "w1": self.w1.tolist(),
                "b1": self.b1.tolist(), "w2": self.w2.tolist(), "b2": float(self.b2)}  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Head:
        def arr(k: str) -> np.ndarray:
            return np.asarray(raw[k], dtype=np.float64)

        return cls(arr("mean"), arr("scale"), arr("w1"), arr("b1"), arr("w2"), float(raw["b2"]))


@dataclass(frozen=True)
class Ensemble:
    """Heads fitted from different seeds; the score is their mean (steadier at the top of the scale, where the
    threshold sits, than one head)."""

    heads: tuple[Head, ...]

    def scores(self, x: np.ndarray) -> np.ndarray:
        mean: np.ndarray = np.mean([h.scores(x) for h in self.heads], axis=0)
        return mean

    def to_json(self) -> list[dict[str, Any]]:
        return [h.to_json() for h in self.heads]

    @classmethod
    def from_json(cls, raw: list[dict[str, Any]]) -> Ensemble:
        return cls(tuple(Head.from_json(h) for h in raw))


@dataclass(frozen=True)
class MatcherModel:
    head: Ensemble
    threshold: float  # serve at or above this score (calibrated: gateway/cache/train.py)
    floor: float  # candidates are examined from this cosine up (the index finds them; the head decides)
    report: dict[str, Any]  # how it was trained and calibrated
    # in the union with the lexical check (cache.semantic_match: union), calibrated on the union's hits
    union_threshold: float
    # the fine-tuned top layers the heads were trained on (None: stock MiniLM), and that file's digest
    encoder: Path | None = None
    encoder_digest: str = ""

    @classmethod
    def load(cls, path: Path = MODEL_PATH) -> MatcherModel:
        """Raises ValueError where the encoder file the heads were trained on is missing or another one."""
        raw = json.loads(path.read_text())
        threshold = float(raw["threshold"])
        encoder, digest = None, ""
        if "encoder" in raw:
            encoder, digest = path.with_name(raw["encoder"]["file"]), raw["encoder"]["digest"]
            if not encoder.is_file() or file_digest(encoder) != digest:
                raise ValueError(f"{path.name} was trained on {encoder.name} ({digest}), which is missing or another "
                                 "file: retrain with `python -m gateway.cache.train`")  # fmt: skip
        return cls(Ensemble.from_json(raw["heads"]), threshold, float(raw["floor"]), raw.get("report", {}),
                   float(raw.get("union_threshold", threshold)), encoder, digest)  # fmt: skip


class LearnedMatcher:
    """Scores candidates for one query; the cached questions' token states are kept (LRU) so that a cached question
    is encoded once, not on every lookup."""

    def __init__(
        self, model: MatcherModel, embedder: TokenEmbedder, threshold: float = 0.0, memo: int = MEMO, *, union: bool = False
    ) -> None:
        """`threshold`: serve at or above this score; 0 = the model's calibrated threshold (its union threshold with
        `union`). `union`: a candidate it rejects may still be served by the lexical check (gateway/cache/semantic.py)."""
        self.model = model
        self.union = union
        self._threshold = threshold or (model.union_threshold if union else model.threshold)
        self.embedder = embedder
        self._memo: OrderedDict[str, Question] = OrderedDict()
        self._limit = memo

    @property
    def threshold(self) -> float:
        return self._threshold

    @property
    def floor(self) -> float:
        return self.model.floor

    async def read(self, texts: list[str]) -> list[Question]:
        """Cached questions, each encoded once (kept in the LRU)."""
        missing = list(dict.fromkeys(t for t in texts if t not in self._memo))
        if missing:
            for text, tokens in zip(missing, await self.embedder.token_states(missing), strict=True):
                self._memo[text] = Question.of(text, tokens)
                if len(self._memo) > self._limit:
                    self._memo.popitem(last=False)
        out = []
        for t in texts:
            self._memo.move_to_end(t)
            out.append(self._memo[t])
        return out

    async def query(self, text: str) -> QueryScorer:
        """Reads a new question (one forward, never kept: a new question is new): its sentence vector, for the
        index, and its token states, for scoring the candidates the index finds."""
        [tokens] = await self.embedder.token_states([text])
        return QueryScorer(self, text, Question.of(text, tokens))


class QueryScorer:
    """One lookup's question, read; scores the index's candidates against it."""

    def __init__(self, matcher: LearnedMatcher, text: str, question: Question) -> None:
        self.matcher, self.text, self.question = matcher, text, question
        self.threshold, self.floor, self.union = matcher.threshold, matcher.floor, matcher.union

    @property
    def vector(self) -> list[float]:
        return self.question.vector

    async def scores(self, candidates: list[tuple[str, float]]) -> list[float]:
        """The heads' score for each (cached question, cosine)."""
        if not candidates:
            return []
        read = await self.matcher.read([text for text, _ in candidates])
        rows = np.stack([features(self.text, text, self.question, q, similarity=sim)
                         for (text, sim), q in zip(candidates, read, strict=True)])  # fmt: skip
        return [float(s) for s in scored(self.matcher.model.head, rows, self.text, [text for text, _ in candidates])]
