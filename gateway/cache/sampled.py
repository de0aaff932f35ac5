"""The sampled check of semantic hits for models the engine cannot score (third-party APIs, gateway/routing/cached.py).

The lexical check decides which candidates are served. A share of those hits (`cache.upstream_sample`) is sent to
the provider anyway: the client gets the provider's fresh answer, and the gateway compares it with the cached one
(the cosine of the two answers' embedded openings, gateway/cache/relevance.py's excerpt) against
`cache.upstream_agreement`. The outcome is recorded against the entry with the candidate's similarity
(gateway/cache/thresholds.py), and an entry whose answer once disagreed is never served again at that similarity or
below (correctness grows with similarity: what failed at 0.85 is no safer at 0.80). A look-alike the words let
through is sampled about once in 1 / upstream_sample hits, and caught only if the two answers disagree: how often
they do depends on the provider (`python -m bench.cache --only agreement` measures it; with SmolLM2-135M 70% of
look-alike pairs disagree at 0.8, and 60% of paraphrase pairs do too, which blocks right entries: fewer hits, never
a wrong answer).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from gateway.cache.thresholds import EntryThresholds

Admission = Literal["serve", "sample", "blocked"]


class SampledCheck:
    def __init__(self, rate: float, agreement: float, record: EntryThresholds,
                 draw: Callable[[], float] = random.random) -> None:  # fmt: skip
        """`record`: the outcomes per entry (shared by replicas when it has a log); `draw`: a uniform number in
        [0, 1) per candidate (tests pass a fixed sequence)."""
        self.rate, self.agreement, self.draw, self.record = rate, agreement, draw, record

    async def admit(self, key: str, similarity: float) -> Admission:
        """Whether a candidate the lexical check accepted is served, sent to the provider to be compared, or
        refused because its entry's answer already disagreed (on any replica) at this similarity or above."""
        await self.record.refresh()
        if self.record.contradicted(key, similarity):
            return "blocked"
        return "sample" if self.rate > 0 and self.draw() < self.rate else "serve"

    async def observe(self, key: str, similarity: float, cosine: float) -> bool:
        """Record one comparison (the two answers' cosine); True when they agreed."""
        agreed = cosine >= self.agreement
        await self.record.record(key, similarity, agreed)
        return agreed
