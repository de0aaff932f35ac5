"""OpenAI's Files and Batch APIs (gateway/batches/, docs/batches.md) through the official `openai` SDK against
real `python -m gateway` processes (real SmolLM2): the round trip, validation, tenant isolation, a restricted
key's policy on its lines, file expiry, cancel, metrics, a kill -9 in the middle of a batch with no line lost
or repeated, and two gateways on one directory (one runs the batches, the other takes over when it dies)."""

from __future__ import annotations

import io
import json
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from gateway_fixtures import assert_schema

from bench.server import SMALL_SERVER_ENV, GatewayProcess
from gateway.batches.config import BatchesConfig
from gateway.batches.store import ProgressLog
from gateway.batches.validate import parse_input
from gateway.config import ConfigError, load_config
from gateway.spend.config import LedgerConfig

KEY_A, KEY_B = "sk-batch-tenant-a", "sk-batch-tenant-b"
ADMIN = "sk-batch-operator"  # reads /metrics
RESTRICTED = "sk-batch-restricted"  # one chat model, max_tokens capped at CAP, at most 2 sequences a request
TPM_KEY = "sk-batch-tpm"  # TPM tokens per minute
CAP, TPM = 8, 120
MAX_FILE = 100_000
CHAT = "/v1/chat/completions"


def chat_line(i: int, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": max_tokens}
    return {"custom_id": f"req-{i}", "method": "POST", "url": CHAT, "body": {**body, "temperature": 0, **extra}}


def jsonl(lines: list[Any]) -> bytes:
    return "\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines).encode() + b"\n"


def upload(client: openai.OpenAI, lines: list[Any], purpose: str = "batch") -> Any:
    return client.files.create(file=("input.jsonl", io.BytesIO(jsonl(lines))), purpose=purpose)  # type: ignore[arg-type]


def wait_for(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], timeout_s: float = 300) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses or time.monotonic() > deadline:
            return batch
        time.sleep(0.3)


def server_env(store: Path, **extra: str) -> dict[str, str]:
    """KEY_A and KEY_B (plain keys: every model, the default caps) and, from a configuration file, the keys
    with policies of their own."""
    config = store.parent / f"{store.name}-gateway.yaml"
    policies = [
        {"key": RESTRICTED, "name": "restricted", "models": ["gpt-4o-mini"], "max_tokens": CAP, "max_sequences": 2},
        {"key": TPM_KEY, "name": "tpm", "tpm": TPM},
    ]
    config.write_text(yaml.safe_dump({"api_keys": policies}))
    return {
        **SMALL_SERVER_ENV,
        "SMOLGATE_CONFIG": str(config),
        "SMOLGATE_API_KEYS": f"{KEY_A},{KEY_B}",
        "SMOLGATE_ADMIN_KEYS": ADMIN,
        "SMOLGATE_BATCHES_DIR": str(store),
        "SMOLGATE_BATCHES_MAX_FILE_BYTES": str(MAX_FILE),
        "SMOLGATE_ACCESS_LOG": "false",
        **extra,
    }


@pytest.fixture(scope="module")
def store() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="smolgate-batches-") as d:
        yield Path(d) / "store"


@pytest.fixture(scope="module")
def server(store: Path) -> Iterator[GatewayProcess]:
    # expires_after down to 1 s and a sweep every 0.5 s: expiry is tested in seconds, not hours
    env = server_env(store, SMOLGATE_EMBEDDINGS="true", SMOLGATE_BATCHES_MIN_EXPIRY_S="1", SMOLGATE_BATCHES_SWEEP_S="0.5")
    proc = GatewayProcess.start(env)
    yield proc
    proc.kill()


def sdk(server: GatewayProcess, key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


# ---- without a server ----------------------------------------------------------------------------------


def test_validation_names_the_bad_lines(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [
        chat_line(1),
        "{not json",
        chat_line(1),  # duplicate custom_id
        {**chat_line(3), "url": "/v1/completions"},  # url mismatch
        {**chat_line(4), "body": {**chat_line(4)["body"], "model": "nope"}},
        {**chat_line(5), "method": "GET"},
        {**chat_line(6), "body": {**chat_line(6)["body"], "stream": True}},
        "",
        chat_line(8),
    ]
    path.write_bytes(jsonl(lines))
    parsed = parse_input(path, CHAT, 100, lambda m: None if m == "gpt-4o-mini" else f"unknown model {m}")
    codes = {e["line"]: e["code"] for e in parsed.errors}
    assert codes == {2: "invalid_json_line", 3: "duplicate_custom_id", 4: "mismatched_url", 5: "model_not_found",
                     6: "invalid_method", 7: "invalid_request"}  # fmt: skip
    assert [line.number for line in parsed.lines] == [1, 9]
    assert parse_input(path, CHAT, 1, lambda m: None).errors[-1]["code"] == "too_many_requests"


def test_progress_log_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    log = ProgressLog(path)
    log.append({"custom_id": "a"})
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"custom_id": "b", "resp')  # killed mid-write
    log = ProgressLog(path)
    assert [r["custom_id"] for r in log.records] == ["a"]
    log.append({"custom_id": "c"})
    log.close()
    assert [json.loads(x)["custom_id"] for x in path.read_text().splitlines()] == ["a", "c"]


def test_config(tmp_path: Path) -> None:
    cfg = load_config(None, {"SMOLGATE_BATCHES_DIR": str(tmp_path), "SMOLGATE_BATCHES_MAX_CONCURRENCY": "8"})
    assert cfg.batches.path == tmp_path and cfg.batches.max_concurrency == 8
    path = tmp_path / "gw.yaml"
    path.write_text("batches: {busy_concurrency: 3, max_file_bytes: 1000}\n")
    cfg = load_config(path, {})
    assert cfg.batches.busy_concurrency == 3 and cfg.batches.max_file_bytes == 1000
    for bad in ("batches: {nope: 1}\n", "batches: {max_concurrency: 0}\n"):
        path.write_text(bad)
        with pytest.raises(ConfigError):
            load_config(path, {})
    assert BatchesConfig().priority == 2**31 - 1


def test_default_dir_follows_smolgate_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches store lives in the one smolgate cache folder, as models, kernels and the ledger do."""
    monkeypatch.setenv("SMOLGATE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # not read: SMOLGATE_CACHE is the one setting
    assert BatchesConfig().path == tmp_path / "cache" / "batches"
    assert LedgerConfig().path == tmp_path / "cache" / "ledger"
    monkeypatch.delenv("SMOLGATE_CACHE")
    assert BatchesConfig().path == Path.home() / ".cache" / "smolgate" / "batches"


# ---- against a real gateway ----------------------------------------------------------------------------


def test_files_round_trip(server: GatewayProcess) -> None:
    client = sdk(server)
    f = upload(client, [chat_line(1)])
    assert_schema("OpenAIFile", f.model_dump(exclude_none=True))
    assert f.purpose == "batch" and f.bytes == len(jsonl([chat_line(1)])) and f.filename == "input.jsonl"
    assert client.files.retrieve(f.id).id == f.id
    assert f.id in [x.id for x in client.files.list()]
    assert f.id in [x.id for x in client.files.list(purpose="batch")]
    assert f.id not in [x.id for x in client.files.list(purpose="vision")]
    assert client.files.content(f.id).content == jsonl([chat_line(1)])
    deleted = client.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


def test_file_limits_and_bad_uploads(server: GatewayProcess) -> None:
    client = sdk(server)
    with pytest.raises(openai.APIStatusError) as err:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (MAX_FILE + 1))), purpose="batch")
    assert err.value.status_code == 413 and err.value.body["code"] == "request_too_large"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as err:  # too big for the middleware's check too
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (MAX_FILE + 100_000))), purpose="batch")
    assert err.value.status_code == 413
    with pytest.raises(openai.BadRequestError) as err:
        client.files.create(file=("a.jsonl", io.BytesIO(b"{}")), purpose="nonsense")  # type: ignore[arg-type]
    assert err.value.body["param"] == "purpose"  # type: ignore[index]
    resp = httpx.post(f"{server.url}/v1/files", json={"purpose": "batch"}, headers={"authorization": f"Bearer {KEY_A}"})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


def test_batch_round_trip(server: GatewayProcess) -> None:
    client = sdk(server)
    lines = [chat_line(i) for i in range(5)]
    f = upload(client, lines)
    batch = client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h", metadata={"job": "nightly"})
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    assert_schema("Batch", batch.model_dump(exclude_none=True))
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "completed", batch
    assert_schema("Batch", batch.model_dump(exclude_none=True))
    assert batch.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.error_file_id is None
    assert batch.usage is not None and batch.usage.output_tokens == 20
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert sorted(r["custom_id"] for r in out) == sorted(x["custom_id"] for x in lines)
    for r in out:
        assert r["id"].startswith("batch_req_") and r["error"] is None and r["response"]["status_code"] == 200
        assert r["response"]["request_id"] and r["response"]["body"]["object"] == "chat.completion"
        assert_schema("CreateChatCompletionResponse", r["response"]["body"])
    output_file = client.files.retrieve(batch.output_file_id)  # type: ignore[arg-type]
    assert output_file.purpose == "batch_output"
    assert batch.id in [b.id for b in client.batches.list()]
    # the exact cache answers a repeated line (temperature 0): the same text
    again = client.chat.completions.create(**lines[0]["body"])
    first = next(r for r in out if r["custom_id"] == "req-0")
    assert again.choices[0].message.content == first["response"]["body"]["choices"][0]["message"]["content"]


def test_completions_and_embeddings_batches_and_line_errors(server: GatewayProcess) -> None:
    client = sdk(server)
    body = {"model": "gpt-4o-mini", "prompt": "Hi", "max_tokens": 3}
    comp = [{"custom_id": "c1", "method": "POST", "url": "/v1/completions", "body": body},
            {"custom_id": "c2", "method": "POST", "url": "/v1/completions", "body": {**body, "temperature": -1}}]  # fmt: skip
    emb = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
            "body": {"model": "text-embedding-3-small", "input": [f"text {i}", "more"]}} for i in range(3)]  # fmt: skip
    b1 = client.batches.create(input_file_id=upload(client, comp).id, endpoint="/v1/completions", completion_window="24h")
    b2 = client.batches.create(input_file_id=upload(client, emb).id, endpoint="/v1/embeddings", completion_window="24h")
    b1 = wait_for(client, b1.id, ("completed", "failed"))
    assert b1.status == "completed" and b1.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}
    errors = [json.loads(x) for x in client.files.content(b1.error_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert [e["custom_id"] for e in errors] == ["c2"] and errors[0]["response"]["status_code"] == 400
    assert errors[0]["response"]["body"]["error"]["param"] == "temperature"
    b2 = wait_for(client, b2.id, ("completed", "failed"))
    assert b2.status == "completed" and b2.request_counts.completed == 3
    out = [json.loads(x) for x in client.files.content(b2.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert sorted(r["custom_id"] for r in out) == ["e0", "e1", "e2"]
    assert all(len(r["response"]["body"]["data"]) == 2 for r in out)


def test_responses_batch(server: GatewayProcess) -> None:
    """/v1/responses lines run through the Responses API (translated to chat on the engine) like live requests."""
    client = sdk(server)
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/responses",
              "body": {"model": "gpt-4o-mini", "input": f"Say the number {i}.", "max_output_tokens": 16}}
             for i in range(2)]  # fmt: skip
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint="/v1/responses", completion_window="24h")
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "completed" and batch.request_counts.completed == 2, batch
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert sorted(r["custom_id"] for r in out) == ["r0", "r1"]
    assert all(r["response"]["body"]["object"] == "response" and r["response"]["body"]["output"] for r in out)


def test_validation_failures(server: GatewayProcess) -> None:
    client = sdk(server)
    lines = [chat_line(1), "{oops", chat_line(1), {**chat_line(4), "url": "/v1/embeddings"},
             {**chat_line(5), "body": {**chat_line(5)["body"], "model": "no-such-model"}}]  # fmt: skip
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    batch = wait_for(client, batch.id, ("failed", "completed", "in_progress"))
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors is not None
    assert {e.line: e.code for e in batch.errors.data} == {
        2: "invalid_json_line", 3: "duplicate_custom_id", 4: "mismatched_url", 5: "model_not_found"
    }  # fmt: skip
    assert batch.request_counts.completed == 0  # nothing ran
    f = upload(client, [chat_line(1)])
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=f.id, endpoint="/v1/moderations", completion_window="24h")  # type: ignore[arg-type]
    assert err.value.body["param"] == "endpoint"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    other = upload(client, [chat_line(1)], purpose="user_data")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=other.id, endpoint=CHAT, completion_window="24h")
    done = client.batches.retrieve(batch.id)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)


def test_tenant_isolation(server: GatewayProcess) -> None:
    a, b = sdk(server, KEY_A), sdk(server, KEY_B)
    f = upload(a, [chat_line(1)])
    batch = a.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
    for call in (lambda: b.files.retrieve(f.id), lambda: b.files.content(f.id), lambda: b.files.delete(f.id),
                 lambda: b.batches.retrieve(batch.id), lambda: b.batches.cancel(batch.id),
                 lambda: b.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")):  # fmt: skip
        with pytest.raises(openai.NotFoundError):
            call()
    assert f.id not in [x.id for x in b.files.list()]
    assert batch.id not in [x.id for x in b.batches.list()]
    with pytest.raises(openai.AuthenticationError):
        sdk(server, "sk-wrong").files.list()
    batch = wait_for(a, batch.id, ("completed", "failed"))
    assert batch.status == "completed"
    output = batch.output_file_id
    assert output is not None and output in [x.id for x in a.files.list(purpose="batch_output")]
    for other in (b, sdk(server, RESTRICTED)):  # nor its answers, nor anything by listing
        for call in (lambda: other.files.retrieve(output), lambda: other.files.content(output)):  # noqa: B023
            with pytest.raises(openai.NotFoundError):
                call()
        assert output not in [x.id for x in other.files.list()]
        assert batch.id not in [x.id for x in other.batches.list()]


def test_restricted_key_lines_fail_as_its_live_requests_do(server: GatewayProcess) -> None:
    """A key limited to one model, CAP tokens and 2 sequences: its batch's lines that break the policy get the
    very error the live endpoint gives that key (status and body); the others run. A model the key may not use
    fails the batch up front (validation), with the live endpoint's message."""
    client = sdk(server, RESTRICTED)
    breaking = [chat_line(2, max_tokens=CAP + 8), chat_line(3, n=4)]
    live: dict[str, Any] = {}
    for line in breaking:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**line["body"])
        live[line["custom_id"]] = err.value.response.json()
    lines = [chat_line(0), chat_line(1, max_tokens=CAP), *breaking]
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 4, "completed": 2, "failed": 2}
    errors = {r["custom_id"]: r for r in map(json.loads, client.files.content(batch.error_file_id).text.splitlines())}  # type: ignore[arg-type]
    assert set(errors) == set(live)
    for custom_id, record in errors.items():
        assert record["response"]["status_code"] == 400 and record["response"]["body"] == live[custom_id]
    assert live["req-2"]["error"]["param"] == "max_tokens" and live["req-3"]["error"]["param"] == "n"
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert sorted(r["custom_id"] for r in out) == ["req-0", "req-1"]
    assert all(r["response"]["body"]["usage"]["completion_tokens"] <= CAP for r in out)

    embed = {"model": "text-embedding-3-small", "input": "a sentence"}
    with pytest.raises(openai.NotFoundError) as denied:
        client.embeddings.create(**embed)  # type: ignore[arg-type]
    rows = [{"custom_id": "e0", "method": "POST", "url": "/v1/embeddings", "body": embed}]
    batch = client.batches.create(input_file_id=upload(client, rows).id, endpoint="/v1/embeddings", completion_window="24h")
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "failed" and batch.errors is not None and batch.request_counts.completed == 0
    [error] = batch.errors.data
    assert (error.line, error.code) == (1, "model_not_found")
    assert error.message == denied.value.response.json()["error"]["message"]


def test_a_batch_spends_its_keys_tpm_as_it_runs(server: GatewayProcess) -> None:
    """A key with a tpm limit: its lines start only while the tokens they may spend fit in what is left of the
    minute, so each one-minute window is charged about TPM (at most a line or two over, as a live client
    sending one request at a time would be), never the whole batch at once. Lines refused 429 are retried."""
    client = sdk(server, TPM_KEY)
    lines = [chat_line(i, max_tokens=4, ignore_eos=True) for i in range(8)]
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    batch = wait_for(client, batch.id, ("completed", "failed"), timeout_s=400)
    assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 8, "completed": 8, "failed": 0}
    out = [json.loads(x)["response"]["body"] for x in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    tokens = [b["usage"]["total_tokens"] for b in out]
    assert sum(tokens) > 2 * TPM  # the batch needs more than one minute's tokens
    per_window = Counter[int]()
    for body, n in zip(out, tokens, strict=True):
        per_window[body["created"] // 60] += n  # the limiter's one-minute windows (a line ending past one
    assert len(per_window) >= 2  # edge is charged to the next: hence two lines of slack below)
    assert max(per_window.values()) <= TPM + 2 * max(tokens), (per_window, tokens)


def test_file_expiry(server: GatewayProcess, store: Path) -> None:
    """expires_after on upload (OpenAI's shape: anchor created_at, seconds), the default for batch inputs,
    output_expires_after on a batch; an expired file is deleted by the sweep (gone from disk without any
    request touching it) and then answers 404."""
    client = sdk(server)
    soon = client.files.create(
        file=("soon.jsonl", io.BytesIO(b'{"a": 1}\n')), purpose="user_data", expires_after={"anchor": "created_at", "seconds": 2}
    )
    assert_schema("OpenAIFile", soon.model_dump(exclude_none=True))
    assert soon.expires_at == soon.created_at + 2
    on_disk = lambda file_id: list(store.glob(f"files/*/{file_id}.*"))  # noqa: E731
    assert on_disk(soon.id)
    kept = upload(client, [chat_line(1)], purpose="user_data")
    assert kept.expires_at is None
    batch_input = upload(client, [chat_line(1)])
    assert batch_input.expires_at == batch_input.created_at + 30 * 24 * 3600  # OpenAI's default for purpose batch
    for bad, param in (({"anchor": "created_at", "seconds": 0}, "expires_after.seconds"),
                       ({"anchor": "created_at", "seconds": 30 * 24 * 3600 + 1}, "expires_after.seconds"),
                       ({"anchor": "last_active_at", "seconds": 3600}, "expires_after")):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as err:
            client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="batch", expires_after=bad)  # type: ignore[arg-type]
        assert err.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.batches.create(input_file_id=batch_input.id, endpoint=CHAT, completion_window="24h",
                              output_expires_after={"anchor": "created_at", "seconds": -5})  # fmt: skip
    assert err.value.body["param"] == "output_expires_after.seconds"  # type: ignore[index]

    batch = client.batches.create(input_file_id=batch_input.id, endpoint=CHAT, completion_window="24h",
                                  output_expires_after={"anchor": "created_at", "seconds": 8})  # fmt: skip
    batch = wait_for(client, batch.id, ("completed", "failed"))
    assert batch.status == "completed" and batch.output_file_id is not None
    output = client.files.retrieve(batch.output_file_id)
    assert output.expires_at == output.created_at + 8  # anchored at the output file's creation
    assert on_disk(output.id)
    deadline = time.monotonic() + 30
    while (on_disk(soon.id) or on_disk(output.id)) and time.monotonic() < deadline:
        time.sleep(0.2)  # no request in between: only the sweep deletes them
    assert not on_disk(soon.id) and not on_disk(output.id)
    for file_id in (soon.id, output.id):
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            client.files.content(file_id)
    listed = [x.id for x in client.files.list()]
    assert soon.id not in listed and output.id not in listed and kept.id in listed
    assert client.batches.retrieve(batch.id).output_file_id == output.id  # the batch still names it, as OpenAI's does


def test_list_pagination(server: GatewayProcess) -> None:
    client = sdk(server, KEY_B)
    f = upload(client, [chat_line(1)])
    ids = [client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h").id for _ in range(3)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    rest = client.batches.list(limit=2, after=page.data[-1].id)
    assert ids[0] in [b.id for b in rest.data]
    assert {b.id for b in client.batches.list()} >= set(ids)  # the SDK's iterator follows `after`


def test_cancel_keeps_finished_lines(server: GatewayProcess) -> None:
    client = sdk(server)
    lines = [chat_line(i, max_tokens=32, ignore_eos=True) for i in range(200)]
    batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
    deadline = time.monotonic() + 240
    while client.batches.retrieve(batch.id).request_counts.completed < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    started = time.monotonic()
    batch = wait_for(client, batch.id, ("cancelled",), timeout_s=60)
    assert batch.status == "cancelled" and time.monotonic() - started < 30
    assert 1 <= batch.request_counts.completed < 200
    out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
    assert len(out) == batch.request_counts.completed == len({r["custom_id"] for r in out})
    time.sleep(1.5)
    assert client.batches.retrieve(batch.id).request_counts.completed == batch.request_counts.completed  # nothing new


def test_metrics(server: GatewayProcess) -> None:
    text = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
    for name in ("smolgate_batch_lines_queued", "smolgate_batch_lines_running", "smolgate_batch_lines_done_total"):
        assert name in text
    assert 'smolgate_batch_lines_done_total{result="completed"}' in text


def test_restart_in_the_middle_of_a_batch(tmp_path: Path) -> None:
    """kill -9 with lines done and lines in flight, then SIGTERM with more done; a third process on the same
    directory finishes the batch: every custom_id once, nothing failed, and the lines finished before the kill
    are the same records (not run again)."""
    env = server_env(tmp_path, SMOLGATE_BATCHES_MAX_CONCURRENCY="2")
    lines = [chat_line(i, max_tokens=12, ignore_eos=True) for i in range(16)]
    proc = GatewayProcess.start(env)
    try:
        client = sdk(proc)
        batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
        deadline = time.monotonic() + 300
        while client.batches.retrieve(batch.id).request_counts.completed < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.proc.kill()
        proc.proc.wait(30)
    finally:
        proc.kill()
    progress = next(tmp_path.glob(f"batches/*/{batch.id}/out.jsonl"))
    before = {json.loads(x)["custom_id"]: json.loads(x)["id"] for x in progress.read_text().splitlines() if x.endswith("}")}
    assert 3 <= len(before) < len(lines)
    proc = GatewayProcess.start(env)
    try:  # then a graceful stop (SIGTERM) mid-batch: the lines it aborts are not recorded as failed
        client = sdk(proc)
        deadline = time.monotonic() + 300
        while client.batches.retrieve(batch.id).request_counts.completed < len(before) + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.terminate()
        proc.wait(60)
    finally:
        proc.kill()
    proc = GatewayProcess.start(env)
    try:
        client = sdk(proc)
        batch = wait_for(client, batch.id, ("completed", "failed"), timeout_s=400)
        assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 16, "completed": 16, "failed": 0}
        out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
        assert sorted(r["custom_id"] for r in out) == sorted(x["custom_id"] for x in lines)  # none lost, none twice
        after = {r["custom_id"]: r["id"] for r in out}
        assert all(after[c] == rid for c, rid in before.items())  # finished lines were kept, not re-run
    finally:
        proc.kill()


def test_two_gateways_on_one_directory(tmp_path: Path) -> None:
    """The second gateway on a batch directory stands by: its /v1/files and /v1/batches answer 503 naming the
    first, and it runs no line while the first holds the directory. When the first dies (kill -9, mid-batch),
    the second takes the batch over: every line once, none failed."""
    env = server_env(tmp_path, SMOLGATE_BATCHES_MAX_CONCURRENCY="2")
    lines = [chat_line(i, max_tokens=12, ignore_eos=True) for i in range(12)]
    first = GatewayProcess.start(env)
    second = None
    try:
        client = sdk(first)
        batch = client.batches.create(input_file_id=upload(client, lines).id, endpoint=CHAT, completion_window="24h")
        second = GatewayProcess.start(env)
        standby = sdk(second)
        with pytest.raises(openai.InternalServerError) as err:
            standby.batches.retrieve(batch.id)
        assert err.value.status_code == 503 and f"pid {first.proc.pid} " in err.value.message
        with pytest.raises(openai.InternalServerError):
            upload(standby, [chat_line(1)])
        deadline = time.monotonic() + 300
        while client.batches.retrieve(batch.id).request_counts.completed < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        metrics = httpx.get(f"{second.url}/metrics", headers={"authorization": f"Bearer {ADMIN}"}).text
        assert 'smolgate_batch_lines_done_total{result="completed"}' not in metrics  # the standby ran nothing
        first.proc.kill()
        first.proc.wait(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the standby takes over within a second or two
            try:
                standby.batches.retrieve(batch.id)
                break
            except openai.InternalServerError:
                time.sleep(0.2)
        batch = wait_for(standby, batch.id, ("completed", "failed"), timeout_s=400)
        assert batch.status == "completed" and batch.request_counts.model_dump() == {"total": 12, "completed": 12, "failed": 0}
        out = [json.loads(x) for x in standby.files.content(batch.output_file_id).text.splitlines()]  # type: ignore[arg-type]
        assert sorted(r["custom_id"] for r in out) == sorted(x["custom_id"] for x in lines)  # none lost, none twice
    finally:
        first.kill()
        if second is not None:
            second.kill()
