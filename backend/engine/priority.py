"""Request priority, vLLM's convention: a lower `priority` value is served earlier (default 0).

The scheduler orders the waiting queue and picks preemption victims by one key: the effective priority
(the request's priority improved by one level for every `aging_s` seconds since it arrived, so a
low-priority request under a steady stream of urgent ones still gets its turn), then arrival time.
"""

from __future__ import annotations

from backend.engine.request import Sequence


def effective_priority(seq: Sequence, now: float, aging_s: float) -> float:
    """priority - waited / aging_s (aging_s <= 0: no ageing). Lower is more urgent."""
    waited = max(now - seq.arrival_time, 0.0)
    return seq.params.priority - (waited / aging_s if aging_s > 0 else 0.0)


def priority_key(seq: Sequence, now: float, aging_s: float) -> tuple[float, float]:
    """Sort key: most urgent first, then first come first served."""
    return effective_priority(seq, now, aging_s), seq.arrival_time
