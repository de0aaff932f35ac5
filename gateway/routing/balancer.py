"""Choosing a deployment: weighted least-outstanding-requests, prefix affinity, cooldown and probing.

State is per gateway process (outstanding requests are local by nature); shared limits live in
gateway/ratelimit.py.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.routing.config import DeploymentConfig, RouterConfig

_SEEN_KEYS = 4096  # affinity keys remembered per deployment (for the prefix-hit rate)


@dataclass
class DeploymentState:
    """One deployment's live state. `cooldown_until`: no traffic before then (failures, Retry-After);
    after it, one probe request at a time until a success closes the circuit again."""

    cfg: DeploymentConfig
    index: int  # unique in its balancer, never reused (a replica discovered later gets a new one)
    source: int = -1  # the configured deployment it comes from (its position), for replicas found by discovery
    outstanding: int = 0
    consecutive_failures: int = 0
    cooldown_until: float = 0.0
    probing: bool = False
    cooldowns: int = 0
    last_status: int = 0  # of the last failure (429: the upstream asked us to slow down)
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    @property
    def name(self) -> str:
        return self.cfg.label

    def available(self, now: float) -> bool:
        if now < self.cooldown_until:
            return False
        return not (self.cooldown_until and self.probing)  # half-open: one probe in flight at a time

    def remember(self, key: str) -> bool:
        """Note that this deployment served `key`; True when it had already (its KV likely holds it)."""
        hit = key in self.seen
        self.seen[key] = None
        self.seen.move_to_end(key)
        if len(self.seen) > _SEEN_KEYS:
            self.seen.popitem(last=False)
        return hit


@dataclass(frozen=True)
class Choice:
    state: DeploymentState
    affinity: str  # "" (no affinity key), "hit", "miss", "overloaded"


def affinity_key(model: str, text: str, chars: int) -> str:
    """Hash of the conversation's start: the same system prompt + first user turn -> the same key."""
    return hashlib.blake2b(f"{model}\0{text[:chars]}".encode(), digest_size=8).hexdigest()


def request_affinity_key(model: str, raw: Mapping[str, Any], chars: int) -> str:
    """A chat or completions body's affinity key: its `prompt_cache_key` when it has one (the client's own name for
    the prefix it will send again: Codex sends its session), else the conversation's start."""
    key = raw.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return affinity_key(model, f"prompt_cache_key\0{key}", len(key) + 17)
    messages = raw.get("messages")
    if isinstance(messages, list):  # the conversation's start: system prompt and first user turn
        head = [m for m in messages if isinstance(m, dict)][:2]
        text = "\n".join(str(m.get("content", "")) for m in head)
    else:
        text = str(raw.get("prompt", ""))
    return affinity_key(model, text, chars)


def _rendezvous(key: str, states: Sequence[DeploymentState]) -> DeploymentState:
    """Highest-random-weight hashing: stable when replicas come and go (only their keys move)."""

    def score(s: DeploymentState) -> float:
        h = int.from_bytes(hashlib.blake2b(f"{key}\0{s.name}".encode(), digest_size=8).digest(), "big")
        return s.cfg.weight * (h / 2**64)

    return max(states, key=score)


class Balancer:
    """Per-model deployment states; pick() / done() bracket every attempt."""

    def __init__(self, deployments: Sequence[DeploymentConfig], cfg: RouterConfig, clock: Callable[[], float] = time.monotonic):
        """A deployment with `discovery` has no state of its own: sync() adds and removes the replicas found for it."""
        self.states = [DeploymentState(d, i, i) for i, d in enumerate(deployments) if not d.discovery]
        self.cfg = cfg
        self.clock = clock
        self._next_index = len(deployments)

    def sync(self, source: int, members: Sequence[DeploymentConfig]) -> tuple[list[DeploymentState], list[DeploymentState]]:
        """Make the replicas of configured deployment `source` exactly `members` (matched by name and URL: a pod that
        came back under its name at a new address is a new replica): a replica that stays keeps its state (in-flight
        count, cooldown, affinity memory). Returns (added, removed); a removed one may still have attempts in flight,
        which end normally (done/release on a state no longer picked)."""
        wanted = {(m.label, m.base_url) for m in members}
        removed = [s for s in self.states if s.source == source and (s.name, s.cfg.base_url) not in wanted]
        kept = {(s.name, s.cfg.base_url) for s in self.states if s.source == source} - {(s.name, s.cfg.base_url) for s in removed}
        added = []
        for member in members:
            if (member.label, member.base_url) not in kept:
                added.append(DeploymentState(member, self._next_index, source))
                self._next_index += 1
        gone = {id(s) for s in removed}
        self.states = [s for s in self.states if id(s) not in gone] + added
        return added, removed

    def pick(self, key: str, exclude: set[int]) -> Choice | None:
        """The deployment for the next attempt, or None when every one is cooling down or excluded."""
        now = self.clock()
        ready = [s for s in self.states if s.index not in exclude and s.available(now)]
        if not ready:
            return None
        least = min((s.outstanding + 1) / s.cfg.weight for s in ready)
        lightest = [s for s in ready if (s.outstanding + 1) / s.cfg.weight == least]
        state, affinity = random.choice(lightest), ""
        sticky = [s for s in ready if s.cfg.prefix_affinity]
        if key and sticky:
            preferred = _rendezvous(key, sticky)
            floor = min(s.outstanding for s in sticky)
            if preferred.outstanding - floor < self.cfg.affinity_overload:
                state = preferred
            affinity = "hit" if state.remember(key) else ("miss" if state is preferred else "overloaded")
        if state.cooldown_until:
            state.probing = True
        state.outstanding += 1
        return Choice(state, affinity)

    def done(self, state: DeploymentState, ok: bool, retry_after_s: float | None = None) -> bool:
        """Close an attempt; True when this failure started a cooldown."""
        state.outstanding -= 1
        state.probing = False
        if ok:
            state.consecutive_failures = 0
            state.cooldown_until = 0.0
            return False
        state.consecutive_failures += 1
        now = self.clock()
        wait = 0.0
        if state.consecutive_failures >= self.cfg.cooldown_failures or state.cooldown_until:
            wait = self.cfg.cooldown_s  # a failed probe re-opens the circuit for a full period
        if retry_after_s:
            wait = max(wait, retry_after_s)
        if wait <= 0:
            return False
        started = now >= state.cooldown_until
        state.cooldown_until = max(state.cooldown_until, now + wait)
        state.cooldowns += started
        return started

    def release(self, state: DeploymentState) -> None:
        """An attempt that neither succeeded nor failed (the client went away, a 400)."""
        state.outstanding -= 1
        state.probing = False
