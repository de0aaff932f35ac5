"""Budgets in currency per UTC day and month, per key and per team, shared by replicas through Redis.

Before generation a request reserves its estimated cost (the tpm limit's estimate: the body's bytes / 4 for the
prompt plus every token it may generate, at the dearest price its model may be served at) on each counter that
applies; if any counter would pass its budget, the reservation is undone and the request refused. After the
response the reservation is settled to the real cost. Admitted reservations never sum past a budget, and the
estimate bounds the real cost from above, so concurrent requests on any number of replicas cannot overrun it by
more than one request's misestimate. A streamed answer is never cut: its cost was reserved before it started.

Counters are integers of nano-units (1e-9 of the currency): in Redis (`router.redis_url`), else in the ledger's
PostgreSQL database (`ledger.url`), else in process (seeded from the ledger at startup). Like the rate limits, an
outage of the shared store lets traffic through (logged), it never fails every request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.keys.config import KeyPolicy
from gateway.spend.config import TeamBudget

NANO = 1_000_000_000
Sums = dict[str, float]  # name -> spend
_DAY_TTL_S = 2 * 86400
_MONTH_TTL_S = 32 * 86400


@dataclass(frozen=True)
class Counter:
    key: str  # e.g. "<prefix>:budget:key:<name>:d:2026-11-28"
    limit: int  # nano-units
    ttl_s: int
    what: str  # for the error message: "daily budget of key 'ci'"


@dataclass
class Reservation:
    counters: tuple[Counter, ...]
    amount: int  # nano-units reserved


class BudgetCounters(Protocol):
    async def add(self, keys: list[tuple[str, int]], amount: int) -> list[int]: ...

    async def get(self, key: str) -> int: ...

    async def close(self) -> None: ...


class MemoryBudgetCounters:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    async def add(self, keys: list[tuple[str, int]], amount: int) -> list[int]:
        out = []
        for key, _ in keys:
            self.values[key] = self.values.get(key, 0) + amount
            out.append(self.values[key])
        return out

    async def get(self, key: str) -> int:
        return self.values.get(key, 0)

    async def close(self) -> None:
        return None


class RedisBudgetCounters:
    def __init__(self, url: str, timeout_s: float = 0.25) -> None:
        import redis.asyncio as redis  # only gateways configured with Redis import it

        self._redis = redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)

    async def add(self, keys: list[tuple[str, int]], amount: int) -> list[int]:
        async with self._redis.pipeline(transaction=True) as pipe:  # MULTI/EXEC: every counter moves at once
            for key, ttl in keys:
                pipe.incrby(key, amount)
                pipe.expire(key, ttl)
            values = await pipe.execute()
        return [int(v) for v in values[::2]]

    async def get(self, key: str) -> int:
        value = await self._redis.get(key)
        return int(value) if value is not None else 0

    async def close(self) -> None:
        await self._redis.aclose()


class PostgresBudgetCounters:
    """The counters in the ledger's PostgreSQL database (when there is no Redis): one statement moves every counter
    of a request at once (INSERT ... ON CONFLICT DO UPDATE ... RETURNING, atomic per row)."""

    _SCHEMA = "CREATE TABLE IF NOT EXISTS budget_counters (key TEXT PRIMARY KEY, value BIGINT NOT NULL)"
    _ADD = ("INSERT INTO budget_counters (key, value) SELECT k, %s FROM unnest(%s::text[]) AS k "
            "ON CONFLICT (key) DO UPDATE SET value = budget_counters.value + EXCLUDED.value RETURNING key, value")  # fmt: skip

    def __init__(self, url: str, timeout_s: float = 2.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._db: Any = None

    async def _connection(self) -> Any:
        if self._db is None or self._db.closed:
            import psycopg  # only gateways configured with PostgreSQL import it

            self._db = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=str(self.timeout_s))
            await self._db.execute(self._SCHEMA)
        return self._db

    async def add(self, keys: list[tuple[str, int]], amount: int) -> list[int]:
        names = [k for k, _ in keys]
        try:
            async with asyncio.timeout(self.timeout_s):
                cursor = await (await self._connection()).execute(self._ADD, (amount, names))
                values = dict(await cursor.fetchall())
        except BaseException:
            if self._db is not None:  # a broken or timed-out connection is not reused
                await self._db.close()
                self._db = None
            raise
        return [int(values[k]) for k in names]

    async def get(self, key: str) -> int:
        cursor = await (await self._connection()).execute("SELECT value FROM budget_counters WHERE key = %s", (key,))
        row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def close(self) -> None:
        if self._db is not None:
            await self._db.close()


class OverBudget(Exception):
    def __init__(self, what: str, limit: float) -> None:
        super().__init__(what)
        self.what = what
        self.limit = limit


def periods(now: float) -> tuple[str, str]:
    t = time.gmtime(now)
    return time.strftime("%Y-%m-%d", t), time.strftime("%Y-%m", t)


def period_starts(now: float) -> tuple[float, float]:
    """Unix times of the current UTC day's and month's start."""
    t = time.gmtime(now)
    day = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, 0)) - time.timezone
    month = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone
    return float(day), float(month)


class Budgets:
    def __init__(
        self,
        teams: Mapping[str, TeamBudget],
        redis_url: str,
        prefix: str,
        on_error: Callable[[BaseException], None],
        *,
        clock: Callable[[], float] = time.time,
        postgres_url: str = "",
    ) -> None:
        """Counters in Redis when `redis_url` is set, else in PostgreSQL when `postgres_url` is, else in process."""
        self.teams = teams
        self.prefix = prefix
        if redis_url:
            self.counters: BudgetCounters = RedisBudgetCounters(redis_url)
        elif postgres_url:
            self.counters = PostgresBudgetCounters(postgres_url)
        else:
            self.counters = MemoryBudgetCounters()
        self.shared = bool(redis_url or postgres_url)
        self.on_error = on_error
        self.clock = clock

    def applies(self, policy: KeyPolicy) -> bool:
        team = self.teams.get(policy.team) if policy.team else None
        return bool(policy.daily_budget or policy.monthly_budget or (team and (team.daily_budget or team.monthly_budget)))

    def counters_of(self, policy: KeyPolicy) -> tuple[Counter, ...]:
        day, month = periods(self.clock())
        out = []
        scopes = [("key", policy.name, policy.daily_budget, policy.monthly_budget)]
        team = self.teams.get(policy.team) if policy.team else None
        if team is not None:
            scopes.append(("team", policy.team, team.daily_budget, team.monthly_budget))
        for kind, name, daily, monthly in scopes:
            if daily:
                out.append(Counter(f"{self.prefix}:{kind}:{name}:d:{day}", round(daily * NANO), _DAY_TTL_S,
                                   f"daily budget of {kind} '{name}'"))  # fmt: skip
            if monthly:
                out.append(Counter(f"{self.prefix}:{kind}:{name}:m:{month}", round(monthly * NANO), _MONTH_TTL_S,
                                   f"monthly budget of {kind} '{name}'"))  # fmt: skip
        return tuple(out)

    async def reserve(self, policy: KeyPolicy, estimate: float) -> Reservation | None:
        """Hold `estimate` (currency) on every budget of `policy`; OverBudget when one would pass its limit."""
        counters = self.counters_of(policy)
        if not counters:
            return None
        amount = max(0, round(estimate * NANO))
        keys = [(c.key, c.ttl_s) for c in counters]
        try:
            values = await self.counters.add(keys, amount)
        except Exception as exc:  # the store is down: fail open, as the rate limits do
            self.on_error(exc)
            return None
        over = next((c for c, v in zip(counters, values, strict=True) if v > c.limit), None)
        if over is None:
            return Reservation(counters, amount)
        try:
            await self.counters.add(keys, -amount)
        except Exception as exc:
            self.on_error(exc)
        raise OverBudget(over.what, over.limit / NANO)

    async def settle(self, reservation: Reservation, cost: float) -> None:
        """Replace the reserved amount by the real cost."""
        delta = round(cost * NANO) - reservation.amount
        if not delta:
            return
        try:
            await self.counters.add([(c.key, c.ttl_s) for c in reservation.counters], delta)
        except Exception as exc:
            self.on_error(exc)

    def seed(self, key_sums: tuple[Sums, Sums], team_sums: tuple[Sums, Sums]) -> None:
        """In-process counters start from the ledger's spend of this day and month (a restart keeps the budgets)."""
        if not isinstance(self.counters, MemoryBudgetCounters):
            return
        day, month = periods(self.clock())
        for kind, (daily, monthly) in (("key", key_sums), ("team", team_sums)):
            for name, cost in daily.items():
                self.counters.values[f"{self.prefix}:{kind}:{name}:d:{day}"] = round(cost * NANO)
            for name, cost in monthly.items():
                self.counters.values[f"{self.prefix}:{kind}:{name}:m:{month}"] = round(cost * NANO)

    async def close(self) -> None:
        await self.counters.close()
