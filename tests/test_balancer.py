"""gateway/routing/balancer.py: weighted least-outstanding choice, prefix affinity, cooldown and one probe at a time."""

from __future__ import annotations

from collections import Counter

from gateway.routing.balancer import Balancer, affinity_key, request_affinity_key
from gateway.routing.config import DeploymentConfig, RouterConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _balancer(*deps: DeploymentConfig, clock: Clock | None = None, **router: object) -> Balancer:
    return Balancer(deps, RouterConfig(**router), clock or Clock())  # type: ignore[arg-type]


def test_least_outstanding_weighted() -> None:
    b = _balancer(DeploymentConfig(name="a", weight=1), DeploymentConfig(name="b", weight=3))
    picks = Counter()
    held = []
    for _ in range(8):  # nothing finishes: load spreads 1:3 by weight
        choice = b.pick("", set())
        assert choice is not None
        held.append(choice.state)
        picks[choice.state.name] += 1
    assert picks == {"a": 2, "b": 6}
    for state in held:
        b.done(state, True)
    assert all(s.outstanding == 0 for s in b.states)


def test_affinity_sticks_until_the_replica_is_overloaded() -> None:
    deps = [DeploymentConfig(kind="backend", name=n, prefix_affinity=True) for n in ("r1", "r2", "r3")]
    b = _balancer(*deps, affinity_overload=2)
    key = affinity_key("m", "You are helpful.\nTell me about cats.", 512)
    first = b.pick(key, set())
    assert first is not None and first.affinity == "miss"
    b.done(first.state, True)
    again = [b.pick(key, set()) for _ in range(2)]  # two in flight on the preferred replica: still under the margin
    assert all(c is not None and c.state is first.state for c in again)
    assert [c.affinity for c in again if c] == ["hit", "hit"]
    moved = b.pick(key, set())  # 2 more than the others: overloaded, goes to the least loaded
    assert moved is not None and moved.state is not first.state and moved.affinity == "overloaded"
    other_keys = {b.pick(affinity_key("m", f"conversation {i}", 512), set()).state.name for i in range(30)}  # type: ignore[union-attr]
    assert len(other_keys) >= 2  # different conversations spread over replicas


def test_cooldown_then_a_single_probe() -> None:
    clock = Clock()
    b = _balancer(DeploymentConfig(name="a"), clock=clock, cooldown_failures=2, cooldown_s=10)
    (state,) = b.states
    for _ in range(2):
        choice = b.pick("", set())
        assert choice is not None
        started = b.done(choice.state, False)
    assert started and b.pick("", set()) is None  # cooling down
    clock.now += 10
    probe = b.pick("", set())
    assert probe is not None and b.pick("", set()) is None  # one probe at a time
    b.done(probe.state, False)  # the probe failed: a full cooldown again
    assert b.pick("", set()) is None
    clock.now += 10
    probe = b.pick("", set())
    assert probe is not None
    b.done(probe.state, True)
    assert state.cooldown_until == 0 and b.pick("", set()) is not None


def test_retry_after_cools_a_deployment_that_long() -> None:
    clock = Clock()
    b = _balancer(DeploymentConfig(name="a"), DeploymentConfig(name="b"), clock=clock, cooldown_failures=5)
    choice = b.pick("", {1})
    assert choice is not None
    b.done(choice.state, False, retry_after_s=3)
    assert all(b.pick("", set()).state.name == "b" for _ in range(3))  # type: ignore[union-attr]
    clock.now += 3
    assert b.pick("", {1}) is not None


def test_a_prompt_cache_key_is_the_affinity_key() -> None:
    """Codex names its session in `prompt_cache_key`: every turn of it goes where its prefix is cached, even as the
    conversation's start (what keys a request without one) changes."""
    one = {"prompt_cache_key": "session-1", "messages": [{"role": "user", "content": "hi"}]}
    later = {"prompt_cache_key": "session-1", "messages": [{"role": "system", "content": "compacted"}]}
    assert request_affinity_key("m", one, 512) == request_affinity_key("m", later, 512)
    assert request_affinity_key("m", one, 512) != request_affinity_key("m", {**one, "prompt_cache_key": "session-2"}, 512)
    plain = {"messages": one["messages"]}
    assert request_affinity_key("m", plain, 512) == affinity_key("m", "hi", 512)
