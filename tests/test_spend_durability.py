"""The ledger survives `kill -9` once responses are sent, on SQLite and on a real PostgreSQL server.

A real `python -m gateway` answers requests while the test holds the ledger's table locked (a slow or stuck
database: the answers must not wait for it, so every row is only in the journal), is killed with SIGKILL right
after the last answer, and is started again once the lock is released: its startup replays the dead process's
journal, and the Usage API then counts every request, none twice.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cache_fixtures import free_port
from spend_fixtures import POSTGRES_SKIP, PostgresServer, start_postgres

from bench.server import SMALL_SERVER_ENV, GatewayProcess

KEY, ADMIN = "sk-durable-client", "sk-durable-admin"
MODEL = "SmolLM2-135M-Instruct"
REQUESTS = 12


def _start(root: Path, url: str) -> GatewayProcess:
    config = root / "gateway.yaml"
    config.write_text(yaml.safe_dump({
        "api_keys": [{"key": KEY, "name": "durable"}],
        "admin_keys": [ADMIN],
        "spend": {"prices": {MODEL: {"input": 1.0, "output": 2.0}}},
        "ledger": {"dir": str(root / "ledger"), **({"url": url} if url else {})},
        "cache": {"backend": "off"},
    }))  # fmt: skip
    env = {**SMALL_SERVER_ENV, "SMOLGATE_CONFIG": str(config), "SMOLGATE_ACCESS_LOG": "false", "SMOLGATE_NUM_THREADS": "1"}
    return GatewayProcess.start(env)


class SQLiteLock:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), isolation_level=None)
        self.db.execute("BEGIN IMMEDIATE")  # the write lock: the gateway's writer waits (busy) behind it

    def release(self) -> None:
        self.db.execute("ROLLBACK")
        self.db.close()


class PostgresLock:
    def __init__(self, url: str) -> None:
        import psycopg

        self.db = psycopg.connect(url)
        deadline = time.monotonic() + 60  # the gateway's writer thread connects, and creates the table, on its own
        while self.db.execute("SELECT to_regclass('ledger')").fetchone() == (None,) and time.monotonic() < deadline:
            self.db.rollback()
            time.sleep(0.1)
        self.db.execute("LOCK TABLE ledger IN SHARE MODE")  # INSERTs wait behind it

    def release(self) -> None:
        self.db.rollback()
        self.db.close()


def _answer_then_kill(server: GatewayProcess, lock: Any) -> list[str]:
    ids = [f"durable-{time.time_ns()}-{i}" for i in range(REQUESTS)]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say one word."}], "max_tokens": 4}
    with httpx.Client(base_url=server.url, headers={"authorization": f"Bearer {KEY}"}, timeout=60) as http:
        for rid in ids:
            got = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
            assert got.status_code == 200, got.text
            assert got.json()["usage"]["completion_tokens"] > 0
    server.proc.send_signal(signal.SIGKILL)  # right after the last answer
    server.proc.wait(timeout=30)
    if lock is not None:
        lock.release()
    return ids


def _journal(root: Path) -> list[Path]:
    return sorted((root / "ledger").glob("journal-*.jsonl"))


def _usage(server: GatewayProcess) -> dict[str, Any]:
    got = httpx.get(f"{server.url}/v1/organization/usage/completions", headers={"authorization": f"Bearer {ADMIN}"},
                    params={"start_time": int(time.time()) - 3600, "group_by": "api_key_id"}, timeout=60)  # fmt: skip
    assert got.status_code == 200, got.text
    return got.json()


def _check_recovered(root: Path, url: str, ids: list[str], rows_before: int) -> None:
    """A new gateway replays the killed one's journal at startup: every answered request is in the ledger once."""
    assert _journal(root), "the killed gateway left no journal"
    server = _start(root, url)
    try:
        usage = _usage(server)
        results = [r for b in usage["data"] for r in b["results"] if r["api_key_id"] == "durable"]
        assert sum(r["num_model_requests"] for r in results) == REQUESTS
        assert "ledger_replayed" in server.log()
        server.terminate()  # a clean shutdown commits its rows and removes its journal
        assert server.wait(60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once done
    finally:
        server.kill()
    assert rows_before == 0  # while the table was locked, no row had reached it: the journal alone kept them


def test_sqlite_ledger_survives_kill_9(tmp_path: Path) -> None:
    server = _start(tmp_path, "")
    db_path = tmp_path / "ledger" / "ledger.sqlite3"
    lock = SQLiteLock(db_path)
    try:
        ids = _answer_then_kill(server, lock)
    finally:
        server.kill()
    rows_before = sqlite3.connect(str(db_path)).execute("SELECT COUNT(*) FROM ledger").fetchone()[0]
    _check_recovered(tmp_path, "", ids, rows_before)
    with sqlite3.connect(str(db_path)) as db:
        found = {r[0] for r in db.execute("SELECT request_id FROM ledger")}
    assert found == set(ids)
    assert not _journal(tmp_path)  # the dead one's replayed and removed, the second's removed on its shutdown


def test_postgres_ledger_survives_kill_9(tmp_path: Path, postgres: PostgresServer) -> None:
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS ledger")
    server = _start(tmp_path, postgres.url)
    lock = PostgresLock(postgres.url)
    try:
        ids = _answer_then_kill(server, lock)
    finally:
        server.kill()
    with psycopg.connect(postgres.url) as db:
        rows_before = db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0]  # type: ignore[index]
    _check_recovered(tmp_path, postgres.url, ids, rows_before)
    with psycopg.connect(postgres.url) as db:
        rows = db.execute("SELECT request_id, key_name, input_tokens, output_tokens, cost FROM ledger").fetchall()
    assert {r[0] for r in rows} == set(ids) and len(rows) == REQUESTS
    assert all(r[1] == "durable" and r[2] > 0 and r[3] > 0 and r[4] > 0 for r in rows)


def test_a_database_down_at_startup_delays_the_rows_not_the_gateway(tmp_path: Path) -> None:
    """PostgreSQL is not running when the gateway starts: it serves anyway, the rows wait in its journal; after a
    kill -9 and with the database up, the next gateway puts them in."""
    port = free_port()
    url = f"postgresql://nobody@127.0.0.1:{port}/postgres"
    server = _start(tmp_path, url)
    try:
        ids = _answer_then_kill(server, None)
    finally:
        server.kill()
    db = start_postgres(port)
    if db is None:
        pytest.skip(POSTGRES_SKIP)
    try:
        url = db.url
        _check_recovered(tmp_path, url, ids, 0)
        import psycopg

        with psycopg.connect(url) as conn:
            found = {r[0] for r in conn.execute("SELECT request_id FROM ledger").fetchall()}
        assert found == set(ids)
    finally:
        db.stop()
