"""OpenAI's Files and Batch APIs (gateway/batches/, docs/batches.md) through the official `openai` SDK against
real `python -m gateway` processes (real SmolLM2): the round trip, validation, tenant isolation, cancel,
metrics, and a kill -9 in the middle of a batch with no line lost or repeated."""

from __future__ import annotations

import io
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import assert_schema

from bench.server import SMALL_SERVER_ENV, GatewayProcess
from gateway.batches.config import BatchesConfig
from gateway.batches.store import ProgressLog
from gateway.batches.validate import parse_input
from gateway.config import ConfigError, load_config

KEY_A, KEY_B = "sk-batch-tenant-a", "sk-batch-tenant-b"
ADMIN = "sk-batch-operator"  # reads /metrics
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
    return {
        **SMALL_SERVER_ENV,
        "SMOLGATE_API_KEYS": f"{KEY_A},{KEY_B}",
        "SMOLGATE_ADMIN_KEYS": ADMIN,
        "SMOLGATE_BATCHES_DIR": str(store),
        "SMOLGATE_BATCHES_MAX_FILE_BYTES": str(MAX_FILE),
        "SMOLGATE_ACCESS_LOG": "false",
        **extra,
    }


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayProcess]:
    with tempfile.TemporaryDirectory(prefix="smolgate-batches-") as store:
        proc = GatewayProcess.start(server_env(Path(store), SMOLGATE_EMBEDDINGS="true"))
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
    path.write_text("batches: {busy_concurrency: 0, max_file_bytes: 1000}\n")
    cfg = load_config(path, {})
    assert cfg.batches.busy_concurrency == 0 and cfg.batches.max_file_bytes == 1000
    for bad in ("batches: {nope: 1}\n", "batches: {max_concurrency: 0}\n"):
        path.write_text(bad)
        with pytest.raises(ConfigError):
            load_config(path, {})
    assert BatchesConfig().priority == 2**31 - 1


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
    assert wait_for(a, batch.id, ("completed", "failed")).status == "completed"


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
