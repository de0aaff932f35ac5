"""Engine-verified semantic hits: before a paraphrase is answered from the cache, the model that wrote
the cached answer reads it again under the *new* question (one teacher-forced prefill: new prompt +
cached answer, no decoding) and the hit is served only if the answer is about as likely under the new
question as it was under the question it was written for.

Why it works: a small instruction model copies the question into its answer ("The capital of France
is Paris", "To convert miles to kilometers, multiply..."). When the new question is a paraphrase, every
answer token keeps its probability; when it asks something else (another city, the reverse conversion,
the opposite adjective), the tokens that echo or depend on the changed part fall sharply.

The criterion (`Criterion.accept`) compares per-token log-probabilities: the answer's tokens under the
original prompt (recorded when the answer was generated: the engine returns each sampled token's
log-probability) against the same tokens under the new prompt, over the answer's first `max_tokens` tokens. It
accepts when the largest single-token drop and the mean drop are both under thresholds (a loose safety net when the
content words keep their roles, strict when they swapped roles) and enough of the tokens are still the new prompt's
greedy choice; calibrated on the dev split (tests/data/cache_pairs/dev.tsv, `python -m bench.cache_pairs
--calibrate`).

Nothing here imports torch: scoring goes through `EngineClient.generate` with `prompt_logprobs=1` (each token's
log-probability and the most likely token at its position).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from backend.engine.sampling_params import SamplingParams
from backend.errors import EngineError
from gateway.client import EngineClient


@dataclass(frozen=True)
class Scores:
    """The cached answer's first tokens read under the new prompt: each one's log-probability, and whether it is
    the token the new prompt would have chosen greedily (its most likely)."""

    logprobs: tuple[float, ...]
    greedy: tuple[bool, ...]


@dataclass(frozen=True)
class Criterion:
    """Accept a cached answer for a new prompt when, over its first `max_tokens` tokens, no token lost more than
    `max_drop` nats of log-probability, the tokens lost at most `mean_drop` nats on average, and at least
    `min_greedy` of them are still the new prompt's greedy choice.

    Two settings of the drops: one for candidates whose content words keep their roles (the lexical check
    already vouches for them: the verifier only catches gross mismatches), a much stricter one for words that
    swapped roles (a reordered paraphrase, or a role reversal that no word check can see). Only the first
    `max_tokens` answer tokens are scored: the tokens that echo the question come first, and the prefill's cost
    grows with every token."""

    max_drop: float = 6.0
    mean_drop: float = 0.35
    reordered_max_drop: float = 0.5
    reordered_mean_drop: float = 0.05
    min_greedy: float = 0.5
    max_tokens: int = 32

    @staticmethod
    def drops(original: Sequence[float], new: Sequence[float]) -> list[float]:
        return [o - n for o, n in zip(original, new, strict=True)]

    def accept(self, original: Sequence[float], new: Sequence[float] | Scores, reordered: bool = False) -> bool:
        scores = new if isinstance(new, Scores) else Scores(tuple(new), (True,) * len(new))
        n = min(len(original), self.max_tokens)
        if not original or len(scores.logprobs) < n:
            return False
        if not isinstance(new, Scores) and len(new) != len(original):
            return False
        drops = self.drops(original[:n], scores.logprobs[:n])
        max_drop, mean_drop = (self.reordered_max_drop, self.reordered_mean_drop) if reordered else (
            self.max_drop, self.mean_drop)  # fmt: skip
        greedy = sum(scores.greedy[:n]) / n
        return max(drops) <= max_drop and sum(drops) / n <= mean_drop and greedy >= self.min_greedy


@dataclass(frozen=True)
class Answer:
    """What verification needs of a cached answer: its token ids and their log-probabilities under the
    prompt it was generated for."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {"ids": list(self.token_ids), "lps": [round(x, 5) for x in self.logprobs]}

    @staticmethod
    def from_json(raw: object) -> Answer | None:
        if not isinstance(raw, dict):
            return None
        ids, lps = raw.get("ids"), raw.get("lps")
        if not isinstance(ids, list) or not isinstance(lps, list) or not ids or len(ids) != len(lps):
            return None
        return Answer(tuple(int(i) for i in ids), tuple(float(x) for x in lps))


class EngineVerifier:
    """Scores a cached answer under a new prompt with the embedded engine (one prefill)."""

    def __init__(self, engine: EngineClient, criterion: Criterion, new_id: Callable[[], str]) -> None:
        self.engine = engine  # generate() with prompt_logprobs
        self.criterion = criterion
        self._new_id = new_id

    async def score(self, prompt_ids: Sequence[int], answer_ids: Sequence[int]) -> Scores | None:
        """The first `criterion.max_tokens` answer tokens under the new prompt (one prefill: the new prompt, whose
        template prefix the engine's prefix cache already holds, plus those tokens; only the answer's positions get
        logprobs, so the cached prefix is not recomputed); None when the engine cannot take the request."""
        params = SamplingParams(
            temperature=0.0, max_tokens=1, prompt_logprobs=1, prompt_logprobs_from=len(prompt_ids), speculate=False
        )
        answer = list(answer_ids[: self.criterion.max_tokens])
        ids = [*prompt_ids, *answer]
        try:
            stream = self.engine.generate(ids, params, f"cache-verify-{self._new_id()}")
            async with aclosing(stream):
                async for out in stream:
                    if out.prompt_logprobs is not None:
                        tail = out.prompt_logprobs[len(prompt_ids) :]
                        lps = tuple(lp.logprob if lp is not None else float("-inf") for lp in tail)
                        greedy = tuple(lp is not None and bool(lp.top) and lp.top[0][0] == lp.token_id for lp in tail)
                        return Scores(lps, greedy)
        except EngineError:
            return None
        return None

    async def verify(self, prompt_ids: Sequence[int], answer: Answer, reordered: bool = False) -> bool:
        new = await self.score(prompt_ids, answer.token_ids)
        return new is not None and self.criterion.accept(answer.logprobs, new, reordered)
