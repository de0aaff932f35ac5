"""Per-entry thresholds with an operator-set error bound, learned online from verified outcomes (after vCache,
"Verified Semantic Prompt Caching", Schroeder et al.).

A global cosine threshold is wrong for most entries: some cached questions have close neighbours that ask
something else ("capital of France" / "of Germany"), others have none. Every time the engine verifier (or, for
upstream models, a sampled comparison with a fresh answer) judges a candidate, the outcome is recorded against that
entry with the candidate's similarity. A later candidate for the same entry may then skip verification when the
entry's own record bounds the chance of a wrong answer at that similarity by `delta`:

- correctness is assumed to grow with similarity (the vCache assumption), so the outcomes observed at the same or a
  *lower* similarity are at least as likely to be wrong as the new candidate: their error rate over-estimates its;
- the bound is the one-sided Clopper-Pearson upper limit of that error rate at `confidence`, so a skip needs
  evidence: with no error observed, about 3/delta outcomes (300 for delta = 1% at 95%) below the similarity.

Everything else is verified as before; nothing here ever serves a candidate the lexical check rejected. The record
lives in the process (bounded LRU). With an `OutcomeLog` (the Redis cache backend: gateway/cache/redis_store.py)
every outcome is appended to a log all replicas share, and each replica reads what was appended since it last looked
before it decides: replicas learn from each other, and one that starts reads what the others learned. Without it
the record is the replica's own and is lost on restart.
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class OutcomeLog(Protocol):
    """Outcomes shared by replicas: each appended once, read by every replica (its own too) after it was appended."""

    async def append(self, key: str, similarity: float, right: bool) -> None: ...

    async def since_last(self) -> list[tuple[str, float, bool]]: ...


def binomial_upper(errors: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson upper limit on a rate from `errors` in `n` trials (bisection on the binomial CDF)."""
    if n <= 0:
        return 1.0
    if errors >= n:
        return 1.0
    alpha = 1.0 - confidence

    def cdf(p: float) -> float:  # P(X <= errors) for X ~ Binomial(n, p), term by term in logs (n may be large)
        log_p, log_q = math.log(p), math.log1p(-p)
        return sum(math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
                   for k in range(errors + 1))  # fmt: skip

    lo, hi = errors / n, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if cdf(mid) > alpha:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass(frozen=True)
class Decision:
    skip: bool  # serve without verification
    bound: float  # the upper limit on the error rate that decided it
    evidence: int  # outcomes at or below the candidate's similarity


class EntryThresholds:
    """Outcomes per cache entry (similarity, right?) and the skip decision for a new candidate."""

    def __init__(
        self,
        delta: float,
        confidence: float = 0.95,
        per_entry: int = 512,
        entries: int = 10000,
        *,
        log: OutcomeLog | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """`log`: shared with other replicas; `on_error`: told when it fails (the outcome is then kept here only)."""
        self.delta = delta
        self.confidence = confidence
        self.per_entry = per_entry
        self.entries = entries
        self.log, self.on_error = log, on_error
        self._seen: OrderedDict[str, deque[tuple[float, bool]]] = OrderedDict()
        self._reading = asyncio.Lock()  # two requests refreshing at once must not read (and count) the same outcomes

    async def record(self, key: str, similarity: float, right: bool) -> None:
        """One outcome: into the shared log (this replica reads it back with the others' at its next `refresh`), or
        here when there is none or it fails."""
        if self.log is not None:
            try:
                await self.log.append(key, similarity, right)
                return
            except Exception as exc:  # a shared log that is down must not fail the request: keep it here
                self._failed(exc)
        self.observe(key, similarity, right)

    async def refresh(self) -> None:
        """Read what every replica appended to the shared log since the last refresh."""
        if self.log is None:
            return
        async with self._reading:
            try:
                outcomes = await self.log.since_last()
            except Exception as exc:  # decide on what is known here
                self._failed(exc)
                return
            for key, similarity, right in outcomes:
                self.observe(key, similarity, right)

    def _failed(self, exc: BaseException) -> None:
        if self.on_error is not None:
            self.on_error(exc)

    def observe(self, key: str, similarity: float, right: bool) -> None:
        record = self._seen.get(key)
        if record is None:
            record = self._seen[key] = deque(maxlen=self.per_entry)
            while len(self._seen) > self.entries:
                self._seen.popitem(last=False)
        self._seen.move_to_end(key)
        record.append((similarity, right))

    def decide(self, key: str, similarity: float) -> Decision:
        record = self._seen.get(key, ())
        below = [right for sim, right in record if sim <= similarity]
        errors = len(below) - sum(below)
        bound = binomial_upper(errors, len(below), self.confidence)
        return Decision(self.delta > 0 and bound <= self.delta, bound, len(below))

    def contradicted(self, key: str, similarity: float) -> bool:
        """A wrong outcome was recorded for this entry at `similarity` or above (so this candidate is no safer). Asking
        keeps the entry's record recent: a blocked entry is never sampled again, and must not age out of the LRU."""
        record = self._seen.get(key)
        if record is None:
            return False
        self._seen.move_to_end(key)
        return any(not right and sim >= similarity for sim, right in record)

    def __len__(self) -> int:
        return len(self._seen)
