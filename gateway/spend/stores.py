"""Where ledger rows live: SQLite (the embedded default) or PostgreSQL (`spend.ledger_url`, shared by replicas).

Both take rows in batches (one transaction each; a row already there is skipped: journal replays are idempotent)
and answer the aggregate the Usage API and the budgets read. Each is used from one thread at a time: the
writer thread has its own store, readers open another.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.spend.rows import COLUMNS, LedgerRow

_TYPES = {"time": "DOUBLE PRECISION", "batch": "BOOLEAN", "cost": "DOUBLE PRECISION", "input_tokens": "BIGINT",
          "cached_tokens": "BIGINT", "output_tokens": "BIGINT", "status": "INTEGER"}  # fmt: skip


def _schema() -> str:
    cols = ", ".join(f"{c} {_TYPES.get(c, 'TEXT')} NOT NULL" for c in COLUMNS if c != "id")
    return f"CREATE TABLE IF NOT EXISTS ledger (id TEXT PRIMARY KEY, {cols})"


_INDEX = "CREATE INDEX IF NOT EXISTS ledger_time ON ledger (time)"


@dataclass(frozen=True)
class Aggregate:
    """Sums over the rows of one bucket and one (key, model, batch)."""

    bucket: int
    key_name: str
    model: str
    batch: bool
    endpoint: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    requests: int
    cost: float


def _aggregate_sql(mark: str, postgres: bool) -> str:
    # time >= start, so SQLite's truncating CAST is a floor; PostgreSQL's CAST rounds, hence its FLOOR
    bucket = f"CAST(FLOOR((time - {mark}) / {mark}) AS BIGINT)" if postgres else f"CAST((time - {mark}) / {mark} AS INTEGER)"
    return (
        f"SELECT {bucket} AS bucket, key_name, model, batch, endpoint, SUM(input_tokens), "
        f"SUM(cached_tokens), SUM(output_tokens), COUNT(*), SUM(cost) FROM ledger WHERE time >= {mark} AND time < {mark} "
        "GROUP BY bucket, key_name, model, batch, endpoint ORDER BY bucket"
    )


def _sums_sql(mark: str, column: str) -> str:
    return f"SELECT {column}, SUM(cost) FROM ledger WHERE time >= {mark} GROUP BY {column}"


class LedgerStore(Protocol):
    def insert(self, rows: list[LedgerRow]) -> None: ...

    def aggregate(self, start: float, end: float, width_s: int) -> list[Aggregate]: ...

    def sums(self, since: float, column: str) -> dict[str, float]: ...

    def rows(self, start: float, end: float) -> list[LedgerRow]: ...

    def close(self) -> None: ...


def _to_aggregates(raw: list[Any]) -> list[Aggregate]:
    return [
        Aggregate(int(b), k, m, bool(bt), e, int(i), int(c), int(o), int(n), float(cost))
        for b, k, m, bt, e, i, c, o, n, cost in raw
    ]


class SQLiteStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # one connection per thread; WAL: readers do not block the writer (and several processes may share the file)
        self.db = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute(_schema())
        self.db.execute(_INDEX)

    def insert(self, rows: list[LedgerRow]) -> None:
        sql = f"INSERT OR IGNORE INTO ledger ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany(sql, [tuple(getattr(r, c) for c in COLUMNS) for r in rows])
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def aggregate(self, start: float, end: float, width_s: int) -> list[Aggregate]:
        sql = _aggregate_sql("?", postgres=False)
        return _to_aggregates(self.db.execute(sql, (start, width_s, start, end)).fetchall())

    def sums(self, since: float, column: str) -> dict[str, float]:
        return {k: float(v) for k, v in self.db.execute(_sums_sql("?", _column(column)), (since,)).fetchall()}

    def rows(self, start: float, end: float) -> list[LedgerRow]:
        sql = f"SELECT {', '.join(COLUMNS)} FROM ledger WHERE time >= ? AND time < ? ORDER BY time"
        return [_row(r) for r in self.db.execute(sql, (start, end)).fetchall()]

    def close(self) -> None:
        self.db.close()


class PostgresStore:
    def __init__(self, url: str) -> None:
        import psycopg  # only gateways configured with PostgreSQL import it

        self.db = psycopg.connect(url, autocommit=True, connect_timeout=10)
        with self.db.transaction():
            self.db.execute(_schema())
            self.db.execute(_INDEX)

    def insert(self, rows: list[LedgerRow]) -> None:
        sql = (f"INSERT INTO ledger ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))}) "
               "ON CONFLICT (id) DO NOTHING")  # fmt: skip
        with self.db.transaction(), self.db.cursor() as cur:
            cur.executemany(sql, [tuple(getattr(r, c) for c in COLUMNS) for r in rows])

    def aggregate(self, start: float, end: float, width_s: int) -> list[Aggregate]:
        return _to_aggregates(self.db.execute(_aggregate_sql("%s", postgres=True), (start, width_s, start, end)).fetchall())

    def sums(self, since: float, column: str) -> dict[str, float]:
        return {k: float(v) for k, v in self.db.execute(_sums_sql("%s", _column(column)), (since,)).fetchall()}

    def rows(self, start: float, end: float) -> list[LedgerRow]:
        sql = f"SELECT {', '.join(COLUMNS)} FROM ledger WHERE time >= %s AND time < %s ORDER BY time"
        return [_row(r) for r in self.db.execute(sql, (start, end)).fetchall()]

    def close(self) -> None:
        self.db.close()


def _column(column: str) -> str:
    if column not in ("key_name", "team"):  # never a caller's string in SQL
        raise ValueError(f"cannot sum by {column!r}")
    return column


def _row(values: Any) -> LedgerRow:
    data = dict(zip(COLUMNS, values, strict=True))
    data["batch"] = bool(data["batch"])
    return LedgerRow.from_dict(data)


def open_store(url: str, sqlite_path: Path) -> LedgerStore:
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresStore(url)
    return SQLiteStore(sqlite_path)
