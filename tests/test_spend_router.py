"""Spend through the router: an upstream deployment (a real HTTP server standing in for OpenAI, its usage fixed)
pays the shipped list price of its model, streamed and not, under the deployment's name; a torch-free gateway
(no embedded engine); in-process budgets restart from the ledger; and two gateways without Redis share one
budget through their PostgreSQL ledger (a real `postgres`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from routing_fixtures import FakeUpstream, Servers
from spend_fixtures import PostgresServer

from gateway.app import build_context, create_app
from gateway.config import from_mapping
from gateway.context import GatewayContext
from gateway.keys.config import KeyPolicy
from gateway.spend.budget import OverBudget
from gateway.spend.prices import SHIPPED
from gateway.spend.rows import LedgerRow

KEY = "sk-spend-router"
PROMPT, COMPLETION = 11, 6  # what the fake upstream's usage says


@dataclass
class Rig:
    ctx: GatewayContext
    url: str

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=KEY, max_retries=0, timeout=60)

    def row(self, request_id: str) -> LedgerRow:
        ledger = self.ctx.spend.ledger
        assert ledger is not None and ledger.flush()
        rows = [r for r in ledger.read(lambda db: db.rows(0, time.time() + 60)) if r.request_id == request_id]
        assert len(rows) == 1
        return rows[0]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    fake = FakeUpstream("openai")
    upstreams = Servers()
    (upstream,) = upstreams.start([fake.app()])
    config = from_mapping({
        "api_keys": [{"key": KEY, "name": "router-key"}],
        "embeddings": False,
        "cache": {"backend": "off"},
        "models": {"gpt-4o-mini": {"deployments": [
            {"kind": "openai", "name": "openai-mini", "base_url": f"{upstream}/v1", "model": "gpt-4o-mini-2024-07-18"}]}},
        "ledger": {"dir": str(tmp_path_factory.mktemp("router-ledger"))},
    })  # fmt: skip
    ctx = build_context(config, None)  # a routing-only gateway: no engine, no torch
    gateway = Servers()
    (url,) = gateway.start([create_app(ctx)])
    yield Rig(ctx, url)
    gateway.stop()
    upstreams.stop()


def test_an_upstream_pays_its_shipped_list_price(rig: Rig) -> None:
    price = SHIPPED["gpt-4o-mini"]
    rid = f"routed-{time.time_ns()}"
    out = rig.client().chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                               extra_headers={"x-request-id": rid})  # fmt: skip
    assert out.usage is not None and out.usage.prompt_tokens == PROMPT
    row = rig.row(rid)
    assert (row.deployment, row.model, row.key_name) == ("openai-mini", "gpt-4o-mini", "router-key")
    assert (row.input_tokens, row.output_tokens) == (PROMPT, COMPLETION)
    assert row.cost == pytest.approx((PROMPT * price.input + COMPLETION * price.output) / 1e6)
    rid = f"routed-stream-{time.time_ns()}"
    chunks = list(rig.client().chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}],
                                                       stream=True, extra_headers={"x-request-id": rid}))  # fmt: skip
    assert chunks
    row = rig.row(rid)
    assert (row.input_tokens, row.output_tokens) == (PROMPT, COMPLETION) and row.cost > 0


def test_tokenize_refuses_a_model_an_upstream_serves(rig: Rig) -> None:
    got = httpx.post(f"{rig.url}/tokenize", json={"model": "gpt-4o-mini", "prompt": "hi"},
                     headers={"authorization": f"Bearer {KEY}"}, timeout=30)  # fmt: skip
    assert got.status_code == 400 and got.json()["error"]["param"] == "model"
    assert "upstream" in got.json()["error"]["message"]


def test_in_process_budgets_start_from_the_ledger(tmp_path: Path) -> None:
    data: dict[str, Any] = {
        "api_keys": [{"key": "sk-seeded-key-abc", "name": "seeded", "daily_budget": 0.5, "team": "t"}],
        "spend": {"teams": {"t": {"monthly_budget": 10}}},
        "embeddings": False,
        "ledger": {"dir": str(tmp_path)},
    }
    first = build_context(from_mapping(data), None)
    assert first.spend.ledger is not None
    row = LedgerRow(id="r1", time=time.time(), request_id="x", key_name="seeded", team="t", model="m", deployment="",
                    endpoint="/v1/chat/completions", batch=False, input_tokens=1, cached_tokens=0, output_tokens=1,
                    cost=0.45, currency="usd", cache="none", status=200)  # fmt: skip
    first.spend.ledger.record(row)
    first.spend.close()
    second = build_context(from_mapping(data), None)  # a restart: in-process counters, seeded from the ledger
    policy = second.guard.policies[0]
    assert isinstance(policy, KeyPolicy) and policy.name == "seeded"

    async def reserve(amount: float) -> None:
        await second.guard.budgets.reserve(policy, amount)

    with pytest.raises(OverBudget) as caught:
        asyncio.run(reserve(0.1))  # 0.45 spent + 0.1 > 0.5
    assert caught.value.what == "daily budget of key 'seeded'"
    asyncio.run(reserve(0.04))  # 0.49: fits
    second.spend.close()


def test_two_replicas_share_a_budget_through_postgresql(postgres: PostgresServer, tmp_path: Path) -> None:
    """No Redis: the budget counters live in the ledger's PostgreSQL database, which both gateways use."""
    fake = FakeUpstream("priced")
    upstreams = Servers()
    (upstream,) = upstreams.start([fake.app()])
    budget, price = 0.5, {"input": 1000.0, "output": 2000.0}  # dear: 0.023 a request (11 + 6 tokens)
    data = {
        "api_keys": [{"key": KEY, "name": "pg-shared", "daily_budget": budget}],
        "embeddings": False,
        "cache": {"backend": "off"},
        "models": {"m": {"deployments": [{"kind": "openai", "name": "up", "base_url": f"{upstream}/v1"}]}},
        "spend": {"prices": {"m": price}},
    }
    contexts = [build_context(from_mapping({**data, "ledger": {"dir": str(tmp_path / f"r{i}"), "url": postgres.url}}), None)
                for i in range(2)]  # fmt: skip
    assert all(ctx.guard.budgets.shared for ctx in contexts)
    gateways = Servers()
    urls = gateways.start([create_app(ctx) for ctx in contexts])

    def one(i: int) -> bool:
        client = openai.OpenAI(base_url=f"{urls[i % 2]}/v1", api_key=KEY, max_retries=0, timeout=60)
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
            return True
        except openai.RateLimitError as exc:
            assert exc.response.json()["error"]["code"] == "insufficient_quota"
            return False

    try:
        served = refused = 0
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            for _ in range(20):  # waves of 16 at once through both gateways, until a whole wave is refused
                results = list(pool.map(one, range(16)))
                served, refused = served + results.count(True), refused + results.count(False)
                if not any(results):
                    break
        ledger = contexts[0].spend.ledger
        assert ledger is not None
        for ctx in contexts:
            assert ctx.spend.ledger is not None and ctx.spend.ledger.flush()
        rows = [r for r in ledger.read(lambda db: db.rows(0, time.time() + 60)) if r.key_name == "pg-shared"]
    finally:
        gateways.stop()
        upstreams.stop()
    spent, each = sum(r.cost for r in rows), (11 * price["input"] + 6 * price["output"]) / 1e6
    assert served == len(rows) and refused >= 16
    assert spent <= budget + each, f"{spent} spent on a budget of {budget}"
    assert spent >= budget - 0.1 - each  # used up to less than one reservation (0.1 at most for this body)
    print(f"two replicas through PostgreSQL: {served} served, {refused} refused, {spent:.4f} spent of {budget}")
