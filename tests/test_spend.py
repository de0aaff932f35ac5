"""Spend through live servers (the real model and embedder): a ledger row with the right tokens and cost for chat,
completions, responses, messages and embeddings, streamed and not, cached answers (free by default) and batch
lines; budgets per key and per team refused in OpenAI's and Anthropic's shapes, a stream that crosses the line
finished; two replicas crossing one budget at once through Redis; the Usage and Costs APIs against OpenAI's spec;
/tokenize and /detokenize; the CSV export."""

from __future__ import annotations

import concurrent.futures
import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
import yaml
from gateway_fixtures import assert_schema
from spend_fixtures import (
    ADMIN,
    ALICE,
    BOB,
    BOB_DAILY,
    CAROL,
    CHAT_MODEL,
    CHAT_PRICE,
    EMBED_MODEL,
    EMBED_PRICE,
    RESEARCH_DAILY,
    SHARED,
    SHARED_DAILY,
    SpendStack,
    start_spend_stack,
)

from gateway.config import ConfigError, from_mapping
from gateway.keys.config import KeyPolicy
from gateway.spend.config import Price
from gateway.spend.estimate import estimate_cost
from gateway.spend.prices import SHIPPED, PriceTable

ROOT = Path(__file__).resolve().parents[1]
HELLO = [{"role": "user", "content": "Say hello in three words."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpendStack]:
    s = start_spend_stack(tmp_path_factory.mktemp("spend"))
    yield s
    s.stop()


def _rid(name: str) -> str:
    return f"{name}-{time.time_ns()}"


def _cost(price: Price, prompt: int, completion: int, cached: int = 0) -> float:
    return price.cost(prompt, cached, completion)


def test_chat_row_has_the_usage_and_cost(stack: SpendStack) -> None:
    rid = _rid("chat")
    out = stack.client().chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=12,  # type: ignore[arg-type]
                                                 extra_headers={"x-request-id": rid})  # fmt: skip
    row = stack.row(rid)
    assert out.usage is not None
    assert (row.key_name, row.model, row.endpoint, row.batch) == ("alice", CHAT_MODEL, "/v1/chat/completions", False)
    assert (row.input_tokens, row.output_tokens) == (out.usage.prompt_tokens, out.usage.completion_tokens)
    assert row.cost == pytest.approx(_cost(CHAT_PRICE, row.input_tokens, row.output_tokens, row.cached_tokens))
    assert row.cost > 0 and row.currency == "usd" and row.status == 200 and row.team == ""
    assert ALICE not in json.dumps(row.to_dict())  # the key's name, never the key


def test_streamed_chat_row_matches_the_streamed_usage(stack: SpendStack) -> None:
    rid = _rid("stream")
    chunks = list(stack.client().chat.completions.create(
        model=CHAT_MODEL, messages=HELLO, max_tokens=10, stream=True, stream_options={"include_usage": True},  # type: ignore[arg-type]
        extra_headers={"x-request-id": rid},
    ))  # fmt: skip
    usage = chunks[-1].usage
    assert usage is not None
    row = stack.row(rid)
    assert (row.input_tokens, row.output_tokens) == (usage.prompt_tokens, usage.completion_tokens)
    assert row.cost == pytest.approx(_cost(CHAT_PRICE, usage.prompt_tokens, usage.completion_tokens, row.cached_tokens))


def test_completions_row(stack: SpendStack) -> None:
    rid = _rid("completions")
    out = stack.client().completions.create(model=CHAT_MODEL, prompt="The capital of France is", max_tokens=6,
                                            extra_headers={"x-request-id": rid})  # fmt: skip
    row = stack.row(rid)
    assert out.usage is not None and row.endpoint == "/v1/completions"
    assert (row.input_tokens, row.output_tokens) == (out.usage.prompt_tokens, out.usage.completion_tokens)


def test_responses_rows_streamed_and_not(stack: SpendStack) -> None:
    client = stack.client()
    rid = _rid("responses")
    out = client.responses.create(model=CHAT_MODEL, input="Name a colour.", max_output_tokens=16,
                                  extra_headers={"x-request-id": rid})  # fmt: skip
    row = stack.row(rid)
    assert out.usage is not None and row.endpoint == "/v1/responses"
    assert (row.input_tokens, row.output_tokens) == (out.usage.input_tokens, out.usage.output_tokens)
    rid = _rid("responses-stream")
    events = list(client.responses.create(model=CHAT_MODEL, input="Name a fruit.", max_output_tokens=16, stream=True,
                                          extra_headers={"x-request-id": rid}))  # fmt: skip
    done = events[-1].response  # type: ignore[union-attr]
    row = stack.row(rid)
    assert (row.input_tokens, row.output_tokens) == (done.usage.input_tokens, done.usage.output_tokens)


def _anthropic(stack: SpendStack, key: str = ALICE) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.urls["main"], api_key=key, max_retries=0, timeout=120)


def test_messages_rows_streamed_and_not(stack: SpendStack) -> None:
    client = _anthropic(stack)
    rid = _rid("messages")
    out = client.messages.create(model=CHAT_MODEL, max_tokens=12, messages=HELLO,  # type: ignore[arg-type]
                                 extra_headers={"x-request-id": rid})  # fmt: skip
    row = stack.row(rid)
    assert row.endpoint == "/v1/messages" and row.key_name == "alice"
    assert row.output_tokens == out.usage.output_tokens
    assert row.input_tokens == out.usage.input_tokens + (out.usage.cache_read_input_tokens or 0)
    rid = _rid("messages-stream")
    with client.messages.stream(model=CHAT_MODEL, max_tokens=12, messages=HELLO,  # type: ignore[arg-type]
                                extra_headers={"x-request-id": rid}) as stream:  # fmt: skip
        final = stream.get_final_message()
    row = stack.row(rid)
    assert row.output_tokens == final.usage.output_tokens > 0


def test_embeddings_row_costs_input_only(stack: SpendStack) -> None:
    rid = _rid("embeddings")
    out = stack.client().embeddings.create(model=EMBED_MODEL, input=["one sentence", "and another one"],
                                           extra_headers={"x-request-id": rid})  # fmt: skip
    row = stack.row(rid)
    assert (row.model, row.endpoint, row.output_tokens) == (EMBED_MODEL, "/v1/embeddings", 0)
    assert row.input_tokens == out.usage.prompt_tokens > 0
    assert row.cost == pytest.approx(_cost(EMBED_PRICE, row.input_tokens, 0))


def test_cached_answer_has_a_row_and_costs_nothing_by_default(stack: SpendStack) -> None:
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Count to three."}], "max_tokens": 8,
            "temperature": 0}  # fmt: skip
    first, second = _rid("miss"), _rid("hit")
    with httpx.Client(base_url=stack.urls["main"], headers={"authorization": f"Bearer {ALICE}"}, timeout=120) as http:
        a = http.post("/v1/chat/completions", json=body, headers={"x-request-id": first})
        b = http.post("/v1/chat/completions", json=body, headers={"x-request-id": second})
    assert a.headers["x-cache"] == "miss" and b.headers["x-cache"] == "hit"
    miss, hit = stack.row(first), stack.row(second)
    assert miss.cache == "miss" and miss.cost > 0
    assert hit.cache == "hit" and hit.cost == 0.0
    assert (hit.input_tokens, hit.output_tokens) == (miss.input_tokens, miss.output_tokens)


def test_batch_lines_have_rows(stack: SpendStack) -> None:
    client = stack.client()
    lines = [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": CHAT_MODEL, "messages": [{"role": "user", "content": f"Say {i}."}], "max_tokens": 5}}
             for i in range(3)]  # fmt: skip
    data = "\n".join(json.dumps(x) for x in lines).encode() + b"\n"
    upload = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 180
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.monotonic() < deadline:
        time.sleep(0.3)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.output_file_id
    outputs = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    usage = {o["response"]["request_id"]: o["response"]["body"]["usage"] for o in outputs}
    rows = {r.request_id: r for r in stack.rows() if r.batch}
    for request_id, u in usage.items():
        row = rows[request_id]
        assert (row.key_name, row.endpoint) == ("alice", "/v1/chat/completions")
        assert (row.input_tokens, row.output_tokens) == (u["prompt_tokens"], u["completion_tokens"])


# ---- budgets ----------------------------------------------------------------------------------------------------


def _spent(stack: SpendStack, key: str, name: str = "main") -> float:
    return sum(r.cost for r in stack.rows(name) if r.key_name == key)


def test_key_budget_refuses_with_insufficient_quota_and_a_stream_crossing_it_is_finished(stack: SpendStack) -> None:
    client = stack.client(BOB)
    # a stream whose reservation fits, however long it runs: it is never cut
    chunks = list(client.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=64, stream=True,  # type: ignore[arg-type]
                                                 stream_options={"include_usage": True}))  # fmt: skip
    assert chunks[-1].usage is not None and any(c.choices and c.choices[0].finish_reason for c in chunks)
    refused = None
    for _ in range(40):
        try:
            client.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=64)  # type: ignore[arg-type]
        except openai.RateLimitError as exc:
            refused = exc
            break
    assert refused is not None, "bob's daily budget never refused a request"
    assert refused.status_code == 429
    error = refused.response.json()["error"]
    assert error["type"] == error["code"] == "insufficient_quota" and "daily budget of key 'bob'" in error["message"]
    assert _spent(stack, "bob") <= BOB_DAILY  # admitted reservations never pass the budget
    # Anthropic's shape on /v1/messages
    with pytest.raises(anthropic.RateLimitError) as caught:
        _anthropic(stack, BOB).messages.create(model=CHAT_MODEL, max_tokens=64, messages=HELLO)  # type: ignore[arg-type]
    body = caught.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "billing_error"
    # another key is not affected
    assert stack.client(ALICE).chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=4).usage is not None  # type: ignore[arg-type]
    # a batch line of a key whose budget is spent fails at once, with the same error (no retry loop)
    lines = [{"custom_id": "over", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": CHAT_MODEL, "messages": HELLO, "max_tokens": 64}}]  # fmt: skip
    data = "\n".join(json.dumps(x) for x in lines).encode() + b"\n"
    upload = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.3)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None and batch.request_counts.failed == 1
    assert batch.error_file_id is not None
    failed = json.loads(client.files.content(batch.error_file_id).text)
    assert failed["response"]["status_code"] == 429
    assert failed["response"]["body"]["error"]["code"] == "insufficient_quota"


def test_team_budget_holds_for_its_keys(stack: SpendStack) -> None:
    client = stack.client(CAROL)
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(60):
            client.embeddings.create(model=EMBED_MODEL, input=["a fairly long sentence to embed " * 20] * 16)
            client.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=64)  # type: ignore[arg-type]
    assert "daily budget of team 'research'" in caught.value.response.json()["error"]["message"]
    assert _spent(stack, "carol") <= RESEARCH_DAILY
    assert {r.team for r in stack.rows() if r.key_name == "carol"} == {"research"}


def test_two_replicas_cross_one_budget_at_once(stack: SpendStack) -> None:
    if "r1" not in stack.urls:
        pytest.skip("redis-server is not installed: the replicas' shared budget needs it")

    def one(i: int) -> float | None:
        client = stack.client(SHARED, "r1" if i % 2 else "r2")
        try:
            client.chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=32)  # type: ignore[arg-type]
            return 1.0
        except openai.RateLimitError as exc:
            assert exc.response.json()["error"]["code"] == "insufficient_quota"
            return None

    served = refused = 0
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for _ in range(20):  # waves of 16 at once, half through each replica, until a whole wave is refused
            results = list(pool.map(one, range(16)))
            served, refused = served + results.count(1.0), refused + results.count(None)
            if results.count(None) == len(results):
                break
    rows = [r for r in stack.rows("r1") if r.key_name == "shared"]  # both replicas write one SQLite ledger
    spent = sum(r.cost for r in rows)
    most = max(r.cost for r in rows)
    assert served == len(rows) and served >= 2 and refused >= 16
    assert spent <= SHARED_DAILY + most, f"{spent} spent on a budget of {SHARED_DAILY}"
    # and the budget is used, not merely refused: what is left is less than one request's reservation
    body = {"messages": HELLO, "model": CHAT_MODEL, "max_tokens": 32}
    reserve = estimate_cost("chat", body, KeyPolicy(max_tokens=1024), CHAT_PRICE) * 1.1  # the SDK's JSON spacing differs
    assert spent >= SHARED_DAILY - reserve - most, f"only {spent} of {SHARED_DAILY} spent"
    print(f"two replicas: {served} served, {refused} refused, {spent:.4f} spent of {SHARED_DAILY}")


# ---- the Usage and Costs APIs -------------------------------------------------------------------------------------


def _admin_get(stack: SpendStack, path: str, key: str = ADMIN, **params: object) -> httpx.Response:
    return httpx.get(f"{stack.urls['main']}{path}", params=params, headers={"authorization": f"Bearer {key}"}, timeout=60)


def test_usage_api_in_openais_shape_by_key_and_model(stack: SpendStack) -> None:
    stack.client().chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=4)  # type: ignore[arg-type]
    start = int(time.time()) - 86400
    got = _admin_get(stack, "/v1/organization/usage/completions", start_time=start, bucket_width="1d",
                     group_by=["api_key_id", "model"])  # fmt: skip
    assert got.status_code == 200, got.text
    page = got.json()
    assert_schema("UsageResponse", page)
    results = [r for b in page["data"] for r in b["results"]]
    alice = [r for r in results if r["api_key_id"] == "alice" and r["model"] == CHAT_MODEL]
    assert alice and alice[0]["num_model_requests"] >= 1
    rows = [r for r in stack.rows() if r.key_name == "alice" and r.model == CHAT_MODEL and r.endpoint != "/v1/embeddings"]
    assert sum(r["input_tokens"] for r in alice) == sum(r.input_tokens for r in rows)
    assert sum(r["output_tokens"] for r in alice) == sum(r.output_tokens for r in rows)
    assert not [r for r in results if r["model"] == EMBED_MODEL]  # embeddings have their own usage page

    costs = _admin_get(stack, "/v1/organization/costs", start_time=start, group_by=["api_key_id", "line_item"])
    assert costs.status_code == 200, costs.text
    assert_schema("UsageResponse", costs.json())
    amounts = [r for b in costs.json()["data"] for r in b["results"] if r["api_key_id"] == "alice"]
    assert sum(r["amount"]["value"] for r in amounts) == pytest.approx(sum(r.cost for r in stack.rows() if r.key_name == "alice"))
    assert {r["amount"]["currency"] for r in amounts} == {"usd"}

    only = _admin_get(stack, "/v1/organization/usage/completions", start_time=start, group_by=["api_key_id", "batch"],
                      api_key_ids="alice", batch="true").json()  # fmt: skip
    assert_schema("UsageResponse", only)
    kept = [r for b in only["data"] for r in b["results"]]
    assert kept and {(r["api_key_id"], r["batch"]) for r in kept} == {("alice", True)}  # the batch lines' test
    assert sum(r["num_model_requests"] for r in kept) == len([r for r in stack.rows() if r.key_name == "alice" and r.batch])

    emb = _admin_get(stack, "/v1/organization/usage/embeddings", start_time=start, group_by="model")
    assert emb.status_code == 200
    assert_schema("UsageResponse", emb.json())


def test_usage_api_buckets_pages_and_errors(stack: SpendStack) -> None:
    now = int(time.time())
    window = {"start_time": now - 3 * 3600, "end_time": now, "bucket_width": "1h", "limit": 2}
    page = _admin_get(stack, "/v1/organization/usage/completions", **window).json()
    assert_schema("UsageResponse", page)
    assert len(page["data"]) == 2 and page["has_more"] is True and page["next_page"] == str(now - 3600)
    rest = _admin_get(stack, "/v1/organization/usage/completions", **window, page=page["next_page"]).json()
    assert len(rest["data"]) == 1 and rest["has_more"] is False
    assert rest["data"][0]["results"] and rest["data"][0]["results"][0]["api_key_id"] is None  # not grouped
    assert _admin_get(stack, "/v1/organization/usage/completions", key=ALICE, start_time=now).status_code == 401
    bad = _admin_get(stack, "/v1/organization/costs", start_time=now - 60, bucket_width="1h")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "bucket_width"
    assert _admin_get(stack, "/v1/organization/usage/completions").json()["error"]["param"] == "start_time"


def test_usage_cli_prints_a_csv(stack: SpendStack) -> None:
    rows = [r for r in stack.rows() if r.key_name == "alice" and r.model == CHAT_MODEL]  # committed: the CLI reads them
    config = stack.root / "usage.yaml"
    config.write_text(yaml.safe_dump({"ledger": {"dir": str(stack.root / "ledger")}}))
    out = subprocess.run([sys.executable, "-m", "gateway.usage", "--config", str(config), "--days", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True).stdout  # fmt: skip
    lines = out.strip().splitlines()
    assert lines[0] == "date,key,model,requests,input_tokens,cached_tokens,output_tokens,cost,currency"
    alice = [line.split(",") for line in lines[1:] if line.split(",")[1] == "alice" and line.split(",")[2] == CHAT_MODEL]
    assert sum(int(x[3]) for x in alice) == len(rows)
    assert sum(float(x[7]) for x in alice) == pytest.approx(sum(r.cost for r in rows), rel=1e-6)


# ---- /tokenize and /detokenize ------------------------------------------------------------------------------------


def _post(stack: SpendStack, path: str, body: dict[str, object], key: str | None = ALICE) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{stack.urls['main']}{path}", json=body, headers=headers, timeout=60)


def test_tokenize_counts_what_the_chat_endpoint_counts(stack: SpendStack) -> None:
    out = stack.client().chat.completions.create(model=CHAT_MODEL, messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    got = _post(stack, "/tokenize", {"model": "gpt-4o-mini", "messages": HELLO})
    assert got.status_code == 200, got.text
    body = got.json()
    assert out.usage is not None and body["count"] == len(body["tokens"]) == out.usage.prompt_tokens
    assert body["max_model_len"] == 2048 and body["token_strs"] is None
    text = _post(stack, "/tokenize", {"prompt": "The capital of France is", "return_token_strs": True}).json()
    comp = stack.client().completions.create(model=CHAT_MODEL, prompt="The capital of France is", max_tokens=1)
    assert comp.usage is not None and text["count"] == comp.usage.prompt_tokens
    assert "".join(text["token_strs"]) == "The capital of France is"
    back = _post(stack, "/detokenize", {"tokens": text["tokens"]})
    assert back.json() == {"prompt": "The capital of France is"}


def test_tokenize_is_key_checked_and_refuses_bad_input(stack: SpendStack) -> None:
    assert _post(stack, "/tokenize", {"prompt": "hi"}, key=None).status_code == 401
    assert _post(stack, "/detokenize", {"tokens": [1]}, key="sk-wrong").status_code == 401
    bad = _post(stack, "/detokenize", {"tokens": ["a"]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert _post(stack, "/tokenize", {"prompt": "hi", "nope": 1}).json()["error"]["param"] == "nope"
    assert _post(stack, "/tokenize", {"model": "no-such-model", "prompt": "hi"}).status_code == 404
    assert _post(stack, "/tokenize", {"model": EMBED_MODEL, "prompt": "hi"}).status_code == 404


# ---- configuration ------------------------------------------------------------------------------------------------


def test_prices_come_from_the_table_then_the_shipped_list_else_nothing() -> None:
    cfg = from_mapping({
        "models": {"chat": {"deployments": [
            {"kind": "openai", "name": "oai", "base_url": "https://api.example.com/v1", "model": "gpt-4o-mini-2024-07-18"},
            {"kind": "openai", "name": "dear", "base_url": "https://api.example.com/v1", "model": "gpt-4o"},
            {"kind": "backend", "name": "replica", "base_url": "http://backend:8000/v1"},
            {"kind": "embedded"},
        ]}, "claude": {"deployments": [{"kind": "openai", "base_url": "https://a.example.com/v1",
                                        "model": "claude-sonnet-4-5"}]}},
        "spend": {"prices": {"replica": {"input": 0.5, "output": 1}}},
    })  # fmt: skip
    table = PriceTable(cfg.spend, cfg.routing)
    assert table.price("chat", "oai") == SHIPPED["gpt-4o-mini"]  # a dated snapshot pays its family's price
    assert table.price("chat", "dear") == SHIPPED["gpt-4o"]
    assert table.price("chat", "replica") == Price(0.5, 1.0)  # the operator's table, by deployment name
    assert table.price("chat", "embedded") == Price()  # the embedded engine is free unless priced
    assert table.price("claude", "openai:https://a.example.com/v1") == SHIPPED["claude-sonnet-4"]
    assert table.most("chat") == SHIPPED["gpt-4o"]  # the budget's estimate takes the dearest deployment
    assert table.price("SmolLM2-135M-Instruct") == Price()  # no routing: the served model, unpriced
    own = from_mapping({"models": cfg_models(), "spend": {"prices": {"gpt-4o": {"input": 1, "output": 1}}}})
    assert PriceTable(own.spend, own.routing).price("m", "x") == Price(1.0, 1.0)  # an entry replaces the shipped price
    off = from_mapping({"models": cfg_models(), "spend": {"shipped_prices": False}})
    assert PriceTable(off.spend, off.routing).price("m", "x") == Price()


def cfg_models() -> dict[str, object]:
    return {"m": {"deployments": [{"kind": "openai", "name": "x", "base_url": "https://api.example.com/v1", "model": "gpt-4o"}]}}



def test_spend_config_parses_and_refuses_mistakes(tmp_path: Path) -> None:
    cfg = from_mapping({
        "api_keys": [{"key": "sk-a-long-enough-key", "name": "a", "team": "t", "daily_budget": 2, "monthly_budget": 30.5}],
        "spend": {"prices": {"m": {"input": 1, "output": 2, "cached_input": 0.5}}, "teams": {"t": {"daily_budget": 9}},
                  "cache_hit_factor": 0.5, "currency": "eur"},
        "ledger": {"dir": str(tmp_path), "url": "postgresql://u@h/db"},
    })  # fmt: skip
    policy = cfg.key_policies[0]
    assert (policy.team, policy.daily_budget, policy.monthly_budget) == ("t", 2.0, 30.5)
    assert cfg.spend.prices["m"] == Price(1.0, 2.0, 0.5) and cfg.spend.teams["t"].daily_budget == 9.0
    assert cfg.spend.ledger.url == "postgresql://u@h/db" and "postgresql://u@h/db" in cfg.secrets()
    for bad in ({"spend": {"prices": {"m": {"input": -1}}}}, {"spend": {"nope": 1}}, {"ledger": {"url": "mysql://x"}},
                {"spend": {"teams": {"t": {"weekly": 1}}}}, {"api_keys": [{"key": "k", "daily_budget": "lots"}]}):  # fmt: skip
        with pytest.raises(ConfigError):
            from_mapping(bad)
