"""Fixtures for the spend tests: the real engine and embedder behind live uvicorn servers with prices, budgets and
a ledger in a temporary directory; with a redis-server, two more replicas sharing one budget through it; and a
real PostgreSQL server (Debian's `postgres`, initdb'd into a temporary directory on a free port)."""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import openai
from cache_fixtures import RedisServer, free_port, start_redis
from gateway_fixtures import AppServers, gateway_test_config

from gateway.app import build_context, create_app
from gateway.batches.config import BatchesConfig
from gateway.context import GatewayContext
from gateway.keys.config import KeyPolicy
from gateway.routing.config import RouterConfig
from gateway.spend.config import LedgerConfig, Price, SpendConfig, TeamBudget
from gateway.spend.rows import LedgerRow

ALICE, BOB, CAROL, SHARED, ADMIN = "sk-spend-alice", "sk-spend-bob", "sk-spend-carol", "sk-spend-shared", "sk-spend-admin"
CHAT_MODEL, EMBED_MODEL = "SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"
# Dear prices, so that a few tokens cost visible amounts: per 1M tokens
CHAT_PRICE = Price(input=1000.0, output=2000.0, cached_input=500.0)
EMBED_PRICE = Price(input=100.0)
BOB_DAILY = 0.5  # bob's own daily budget
RESEARCH_DAILY = 0.6  # carol's team's
SHARED_DAILY = 1.0  # the key both replicas serve
POSTGRES_SKIP = "PostgreSQL (postgres, initdb) is not installed (make system-deps installs it with apt-get when it can)"


def spend_config(ledger_dir: Path, ledger_url: str = "") -> SpendConfig:
    return SpendConfig(
        prices=MappingProxyType({CHAT_MODEL: CHAT_PRICE, EMBED_MODEL: EMBED_PRICE}),
        teams=MappingProxyType({"research": TeamBudget(daily_budget=RESEARCH_DAILY)}),
        ledger=LedgerConfig(dir=str(ledger_dir), url=ledger_url),
    )


def policies() -> tuple[KeyPolicy, ...]:
    return (
        KeyPolicy(name="alice", key=ALICE),
        KeyPolicy(name="bob", key=BOB, daily_budget=BOB_DAILY),
        KeyPolicy(name="carol", key=CAROL, team="research"),
        KeyPolicy(name="shared", key=SHARED, daily_budget=SHARED_DAILY),
    )


@dataclass
class SpendStack:
    root: Path
    redis: RedisServer | None
    contexts: dict[str, GatewayContext] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    _servers: AppServers = field(default_factory=AppServers)

    def client(self, key: str = ALICE, name: str = "main") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.urls[name]}/v1", api_key=key, max_retries=0, timeout=120)

    def rows(self, name: str = "main") -> list[LedgerRow]:
        ledger = self.contexts[name].spend.ledger
        assert ledger is not None
        assert ledger.flush()
        return ledger.read(lambda db: db.rows(0, time.time() + 3600))  # type: ignore[no-any-return]

    def row(self, request_id: str, name: str = "main") -> LedgerRow:
        rows = [r for r in self.rows(name) if r.request_id == request_id]
        assert len(rows) == 1, f"{len(rows)} ledger rows for {request_id}"
        return rows[0]

    def start(self) -> None:
        from backend.engine.async_engine import AsyncEngine
        from gateway.__main__ import build_embedders

        base = gateway_test_config()
        base = replace(
            base, api_keys=(), key_policies=policies(), admin_keys=(ADMIN,), spend=spend_config(self.root / "ledger"),
            batches=BatchesConfig(dir=str(self.root / "batches"), idle_s=0.05),
        )  # fmt: skip
        configs = {"main": base}
        if self.redis is not None:  # two replicas, one budget: the counters in Redis, the ledger in one SQLite file
            router = RouterConfig(redis_url=self.redis.url, redis_prefix=f"spend{free_port()}")
            shared = replace(base, routing=replace(base.routing, router=router), spend=spend_config(self.root / "shared"),
                             batches=BatchesConfig(enabled=False))  # fmt: skip
            configs["r1"] = configs["r2"] = shared
        engine = AsyncEngine.from_config(base.engine)
        embedder, cache_embedder = build_embedders(base, engine)
        log = (self.root / "gateway.log").open("a", buffering=1)
        for name, cfg in configs.items():
            self.contexts[name] = build_context(cfg, engine, embedder, log, cache_store=None, cache_embedder=cache_embedder)
        apps = [create_app(ctx, manage_engine=(i == 0)) for i, ctx in enumerate(self.contexts.values())]
        self._serve(list(configs), apps)

    def _serve(self, names: list[str], apps: list[Any]) -> None:
        self.urls = dict(zip(names, self._servers.start(apps, "spend", timeout=180.0), strict=True))

    def stop(self) -> None:
        self._servers.stop()
        if self.redis is not None:
            self.redis.stop()


def start_spend_stack(root: Path) -> SpendStack:
    stack = SpendStack(root=root, redis=start_redis())
    stack.start()
    return stack


# ---- PostgreSQL ------------------------------------------------------------------------------------------------


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)  # Debian keeps them off PATH
    return next((str(v / name) for v in versions if (v / name).exists()), None)


@dataclass
class PostgresServer:
    url: str
    process: subprocess.Popen[bytes]
    data: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.data.parent, ignore_errors=True)


def _as_user() -> dict[str, Any]:
    """postgres refuses to run as root: the fixture then runs it as the `nobody` user, on a directory it owns."""
    if os.geteuid() != 0:
        return {}
    import pwd

    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid}


def start_postgres(port: int | None = None) -> PostgresServer | None:
    """A fresh cluster (initdb, trust authentication, no fsync: a test server) on a free port, in a directory of its
    own under /tmp (which the `nobody` user can reach); None without the binaries."""
    initdb, postgres = _pg_bin("initdb"), _pg_bin("postgres")
    if initdb is None or postgres is None:
        return None
    root = Path(tempfile.mkdtemp(prefix="smolgate-pg-"))
    data = root / "pgdata"
    data.mkdir(parents=True)
    sockets = root / "pgsock"
    sockets.mkdir()
    user = _as_user()
    if user:
        for path in (root, data, sockets):
            os.chown(path, user["user"], user["group"])
    owner = "nobody" if user else getpass.getuser()
    subprocess.run([initdb, "-D", str(data), "-U", owner, "--auth=trust", "-E", "UTF8"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **user)  # fmt: skip
    port = port or free_port()
    args = [postgres, "-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", str(sockets), "-c", "fsync=off"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **user)
    # No TLS on a local test server, so libpq never starts its bundled OpenSSL while test threads build ssl contexts
    # (a run of test_spend_router once segfaulted in psycopg's C code amid them; that this was the cause is not known).
    url = f"postgresql://{owner}@127.0.0.1:{port}/postgres?sslmode=disable"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            import psycopg

            psycopg.connect(url, connect_timeout=1).close()
            return PostgresServer(url, process, data)
        except Exception:
            if process.poll() is not None:
                break
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("postgres did not start")
