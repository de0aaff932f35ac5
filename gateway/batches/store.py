"""Batch state on disk: <dir>/batches/<tenant>/<batch_id>/ holds state.json (the Batch object, rewritten
atomically on every status change), input.jsonl (the validated input, copied: deleting the input file
later changes nothing) and the progress logs out.jsonl and err.jsonl: one finished line each, appended as
it finishes. A restart reads the logs back: what is in them is done and never runs again."""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway.batches.storage import read_json, write_json
from gateway.errors import NotFound

_ID = re.compile(r"batch_[0-9a-f]{24}")
TERMINAL = ("completed", "failed", "expired", "cancelled")


def _usage() -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }


class ProgressLog:
    """out.jsonl / err.jsonl: finished lines, in OpenAI's batch output shape, one JSON object a line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        if path.exists():
            self._load()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def _load(self) -> None:
        data = self.path.read_bytes()
        good = 0
        for raw in data.splitlines(keepends=True):
            if not raw.endswith(b"\n"):
                break  # a line the process was killed in the middle of writing
            try:
                self.records.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                break
            good += len(raw)
        if good != len(data):
            os.truncate(self.path, good)

    def append(self, record: dict[str, Any]) -> None:
        os.write(self._fd, orjson.dumps(record) + b"\n")  # one write with O_APPEND: whole lines only
        self.records.append(record)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class BatchJob:
    """One batch: its Batch object (`obj`), whose it is, and its progress logs once it runs."""

    tenant: str
    dir: Path
    obj: dict[str, Any]
    out: ProgressLog | None = None
    err: ProgressLog | None = None
    done: set[str] = field(default_factory=set)  # custom_ids finished (in out or err)
    cancel_requested: bool = False
    output_expiry_s: int | None = None  # output_expires_after.seconds: the output and error files expire then

    @property
    def id(self) -> str:
        return str(self.obj["id"])

    @property
    def status(self) -> str:
        return str(self.obj["status"])

    def save(self) -> None:
        state = {"tenant": self.tenant, "batch": self.obj, "output_expiry_s": self.output_expiry_s}
        write_json(self.dir / "state.json", state)

    def set_status(self, status: str, **extra: Any) -> None:
        self.obj["status"] = status
        stamp = {"in_progress": "in_progress_at", "finalizing": "finalizing_at", "completed": "completed_at",
                 "failed": "failed_at", "expired": "expired_at", "cancelling": "cancelling_at",
                 "cancelled": "cancelled_at"}.get(status)  # fmt: skip
        if stamp:
            self.obj[stamp] = int(time.time())
        self.obj.update(extra)
        self.save()

    def open_progress(self) -> None:
        if self.out is None:
            self.out, self.err = ProgressLog(self.dir / "out.jsonl"), ProgressLog(self.dir / "err.jsonl")
            self.done = {r["custom_id"] for r in self.out.records + self.err.records}
            self.obj["request_counts"]["completed"] = len(self.out.records)
            self.obj["request_counts"]["failed"] = len(self.err.records)
            self.obj["usage"] = _usage()
            for r in self.out.records:
                self._add_usage(r)

    def record(self, record: dict[str, Any], ok: bool) -> None:
        assert self.out is not None and self.err is not None
        (self.out if ok else self.err).append(record)
        self.done.add(record["custom_id"])
        self.obj["request_counts"]["completed" if ok else "failed"] += 1
        self._add_usage(record)

    def _add_usage(self, record: dict[str, Any]) -> None:
        body = (record.get("response") or {}).get("body") or {}
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return
        u = self.obj["usage"]
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        u["input_tokens"] += prompt
        u["output_tokens"] += completion
        u["total_tokens"] += prompt + completion
        u["input_tokens_details"]["cached_tokens"] += cached

    def close(self) -> None:
        for log in (self.out, self.err):
            if log is not None:
                log.close()


class BatchStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "batches"
        self.jobs: dict[str, BatchJob] = {}

    def load(self) -> list[BatchJob]:
        """Every batch on disk (after a restart); the unfinished ones are the runner's to resume."""
        for state in sorted(self.root.glob("*/batch_*/state.json")):
            try:
                data = read_json(state)
            except (OSError, ValueError):
                continue
            job = BatchJob(data["tenant"], state.parent, data["batch"], output_expiry_s=data.get("output_expiry_s"))
            self.jobs[job.id] = job
        return list(self.jobs.values())

    def create(self, tenant: str, obj: dict[str, Any], input_path: Path, output_expiry_s: int | None = None) -> BatchJob:
        d = self.root / tenant / obj["id"]
        d.mkdir(parents=True, exist_ok=True)
        try:
            os.link(input_path, d / "input.jsonl")  # the same bytes, kept if the input file is deleted
        except OSError:
            shutil.copyfile(input_path, d / "input.jsonl")
        job = BatchJob(tenant, d, obj, output_expiry_s=output_expiry_s)
        job.save()
        self.jobs[job.id] = job
        return job

    def get(self, tenant: str, batch_id: str) -> BatchJob:
        job = self.jobs.get(batch_id) if _ID.fullmatch(batch_id or "") else None
        if job is None or job.tenant != tenant:
            raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
        return job

    def list(self, tenant: str) -> list[BatchJob]:
        """Newest first."""
        mine = [j for j in self.jobs.values() if j.tenant == tenant]
        return sorted(mine, key=lambda j: j.id, reverse=True)
