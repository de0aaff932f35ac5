"""BatchRunner with stub endpoint handlers (no model): 429 retries, preemption by live traffic and requeueing,
the lowest priority on every line, resume from the progress log, cancel. The real thing: test_gateway_batches.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import Response

from gateway.batches.config import BATCH_PRIORITY, BatchesConfig
from gateway.batches.files import FileStore
from gateway.batches.runner import BatchRunner
from gateway.batches.storage import new_id
from gateway.batches.store import BatchStore

CHAT = "/v1/chat/completions"


class Log:
    def info(self, *a: Any, **k: Any) -> None: ...

    def error(self, *a: Any, **k: Any) -> None: ...


class Stub:
    """A chat handler: answers after `delay_s`, 429 for the first `limited` calls; counts calls per custom line."""

    def __init__(self, delay_s: float = 0.0, limited: int = 0) -> None:
        self.delay_s, self.limited = delay_s, limited
        self.calls: list[dict[str, Any]] = []
        self.finished: list[str] = []

    async def __call__(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        self.calls.append(body)
        if self.limited > 0:
            self.limited -= 1
            return Response(b'{"error": {"message": "tpm", "type": "rate_limit_error"}}', 429, {"retry-after": "0"})
        await asyncio.sleep(self.delay_s)
        self.finished.append(body["messages"][0]["content"])
        return Response(orjson.dumps({"object": "chat.completion", "usage": {"prompt_tokens": 2, "completion_tokens": 3}}))


def make(tmp: Path, stub: Stub, live: list[int], **cfg: Any) -> tuple[BatchRunner, FileStore, BatchStore]:
    files, store = FileStore(tmp), BatchStore(tmp)
    counter = itertools.count()
    runner = BatchRunner(
        BatchesConfig(dir=str(tmp), idle_s=0.05, **cfg), files, store, {CHAT: stub}, live_in_flight=lambda: live[0],
            policy_of=lambda _t: None,
        model_error=lambda *_: None, takes_priority=lambda *_: True, registry=CollectorRegistry(), logger=Log(),
            new_id=lambda: f"{next(counter):08x}",
    )  # fmt: skip
    return runner, files, store


def create(tmp: Path, files: FileStore, store: BatchStore, n: int) -> Any:
    body = lambda i: {"model": "m", "messages": [{"role": "user", "content": f"c{i}"}], "priority": -9}  # noqa: E731
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": body(i)} for i in range(n)]
    src = tmp / "in.jsonl"
    src.write_text("\n".join(json.dumps(x) for x in lines))
    f = files.create("anonymous", "in.jsonl", "batch", src)
    now = int(time.time())
    obj = {"id": new_id("batch_"), "object": "batch", "endpoint": CHAT, "input_file_id": f["id"], "completion_window": "24h",
           "status": "validating", "created_at": now, "expires_at": now + 86400,
           "request_counts": {"total": 0, "completed": 0, "failed": 0}}  # fmt: skip
    return store.create("anonymous", obj, files.data_path("anonymous", f["id"]))


async def until(cond: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_429_retries_then_lowest_priority_and_output(tmp_path: Path) -> None:
    stub = Stub(limited=3)
    runner, files, store = make(tmp_path, stub, [0], max_concurrency=2)
    await runner.start()
    job = create(tmp_path, files, store, 5)
    runner.submit(job)
    await until(lambda: job.status == "completed")
    await runner.stop()
    assert job.obj["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert len(stub.calls) == 8 and all(c["priority"] == BATCH_PRIORITY for c in stub.calls)
    out = [json.loads(x) for x in files.data_path("anonymous", job.obj["output_file_id"]).read_text().splitlines()]
    assert sorted(r["custom_id"] for r in out) == [f"c{i}" for i in range(5)]
    assert job.obj["usage"]["total_tokens"] == 25


async def test_live_traffic_preempts_and_requeues(tmp_path: Path) -> None:
    stub, live = Stub(delay_s=1.0), [0]
    runner, files, store = make(tmp_path, stub, live, max_concurrency=4, busy_concurrency=1)
    await runner.start()
    job = create(tmp_path, files, store, 8)
    runner.submit(job)
    await until(lambda: len(runner.flights) == 4)
    live[0] = 1  # a live request arrives: 3 of the 4 lines are aborted and queued again
    await until(lambda: runner.metrics.preempted._value.get() == 3)
    await asyncio.sleep(0.05)
    assert len(runner.flights) <= 1
    live[0] = 0
    await until(lambda: job.status == "completed")
    await runner.stop()
    assert job.obj["request_counts"]["completed"] == 8
    assert sorted(stub.finished) == sorted(f"c{i}" for i in range(8))  # each line answered once


async def test_resume_skips_recorded_lines_and_cancel_keeps_them(tmp_path: Path) -> None:
    stub = Stub(delay_s=0.05)
    runner, files, store = make(tmp_path, stub, [0], max_concurrency=1)
    await runner.start()
    job = create(tmp_path, files, store, 30)
    runner.submit(job)
    await until(lambda: job.obj["request_counts"]["completed"] >= 3)
    await runner.stop()  # the server stops
    done = set(job.done)
    stub2 = Stub(delay_s=0.05)
    runner2, files2, store2 = make(tmp_path, stub2, [0], max_concurrency=1)
    await runner2.start()  # resumes
    job2 = store2.jobs[job.id]
    await until(lambda: job2.obj["request_counts"]["completed"] >= len(done) + 2)
    runner2.cancel(job2)
    await until(lambda: job2.status == "cancelled", 5)
    await runner2.stop()
    assert not done & set(stub2.finished)  # recorded lines never ran again
    out = [json.loads(x)["custom_id"] for x in files2.data_path("anonymous", job2.obj["output_file_id"]).read_text().splitlines()]
    assert len(out) == len(set(out)) == job2.obj["request_counts"]["completed"] < 30
