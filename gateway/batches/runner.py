"""The batch runner: validates new batches, runs their lines in the background behind live traffic, and
resumes unfinished batches after a restart.

Concurrency is global (all batches together): `max_concurrency` lines in flight while the gateway is idle,
`busy_concurrency` while live requests are in flight (and `idle_s` after the last one). When live traffic
arrives, the lines beyond `busy_concurrency` are aborted (newest first) and queued again: the engine frees
their slots and KV blocks at once (their prompt blocks stay in the prefix cache). Each line runs at the
engine's lowest priority, so even the lines that keep running are scheduled after live requests.

A key with a tpm limit: a line starts only while the tokens its key's lines in flight may still spend (an
estimate each: prompt bytes / 4 plus max_tokens) fit in what is left of the key's tpm this minute (one line
always may while anything is left). The limit counts tokens when a request ends, so without this every line
would pass the check at once and a batch would spend many minutes' tokens in one burst.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from gateway.batches.config import BatchesConfig
from gateway.batches.dispatch import Handler, Spend, call
from gateway.batches.files import FileStore
from gateway.batches.metrics import BatchMetrics
from gateway.batches.storage import ANONYMOUS
from gateway.batches.store import TERMINAL, BatchJob, BatchStore
from gateway.batches.validate import Line, parse_input
from gateway.keys.config import SHA256_PREFIX, KeyPolicy
from gateway.ops.access_log import Logger

_POLL_S = 0.01
_TPM_POLL_S = 0.25  # how often a line held back by its key's tpm looks again (the counter may live in Redis)
_BYTES_PER_TOKEN = 4  # a rough prompt size from the line's JSON body, to reserve against the key's tpm


def estimate_tokens(body: dict[str, Any], policy: KeyPolicy) -> int:
    """The tokens a line may spend: its body's bytes / 4 for the prompt, plus what it may generate (its
    max_tokens, else the key's cap, which the chat endpoint applies as the default)."""
    limit = next((body[k] for k in ("max_completion_tokens", "max_tokens", "max_output_tokens") if body.get(k)), None)
    generated = limit if isinstance(limit, int) and not isinstance(limit, bool) else policy.max_tokens
    return len(orjson.dumps(body)) // _BYTES_PER_TOKEN + max(int(generated), 0)


@dataclass
class _Flight:
    job: BatchJob
    line: Line
    pending: deque[Line]
    started: float
    tokens: int = 0  # estimate_tokens, held against its key's tpm while in flight
    preempted: bool = False


class BatchRunner:
    def __init__(
        self,
        cfg: BatchesConfig,
        files: FileStore,
        store: BatchStore,
        handlers: dict[str, Handler],
        *,
        live_in_flight: Callable[[], int],
        policy_of: Callable[[str], KeyPolicy | None],
        model_error: Callable[[str, str, KeyPolicy | None], str | None],
        takes_priority: Callable[[str, str], bool],
        registry: CollectorRegistry,
        logger: Logger,
        new_id: Callable[[], str],
        tokens_left: Callable[[KeyPolicy], Awaitable[int | None]] | None = None,
        spend: Spend | None = None,
    ) -> None:
        self.cfg, self.files, self.store, self.handlers = cfg, files, store, handlers
        self.live_in_flight, self.policy_of = live_in_flight, policy_of
        self.model_error, self.takes_priority = model_error, takes_priority
        self.logger, self.new_id, self.tokens_left, self.spend = logger, new_id, tokens_left, spend
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.flights: dict[asyncio.Task[None], _Flight] = {}
        self.queued = 0
        self._last_live = -1e9
        self._watcher: asyncio.Task[None] | None = None
        self._flying = asyncio.Event()  # set when a line takes off: wakes the watcher
        self.metrics = BatchMetrics(registry, lambda: self.queued, lambda: len(self.flights))

    # ---- lifecycle -----------------------------------------------------------------------------------

    async def start(self) -> None:
        for job in self.store.load():
            if job.status not in TERMINAL:
                self.logger.info("batch_resumed", batch_id=job.id, status=job.status, **job.obj["request_counts"])
                self.submit(job)
        self._watcher = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        """The server stops: lines in flight are abandoned (not recorded, so a restart runs them)."""
        tasks = [*self.tasks.values(), *self.flights, *([self._watcher] if self._watcher else [])]
        for flight in self.flights.values():
            flight.preempted = False  # aborted for good: not requeued, not recorded
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for job in self.store.jobs.values():
            job.close()

    def submit(self, job: BatchJob) -> None:
        self.tasks[job.id] = asyncio.create_task(self._run(job), name=f"batch-{job.id}")

    def cancel(self, job: BatchJob) -> None:
        job.cancel_requested = True
        if job.status in ("validating", "in_progress"):
            job.set_status("cancelling")
        if job.id not in self.tasks:  # nothing runs it (cannot happen for unfinished batches, but be safe)
            self.submit(job)

    # ---- concurrency ---------------------------------------------------------------------------------

    def limit(self) -> int:
        now = time.monotonic()
        if self.live_in_flight() > 0:
            self._last_live = now
        busy = min(self.cfg.busy_concurrency, self.cfg.max_concurrency)
        return self.cfg.max_concurrency if now - self._last_live >= self.cfg.idle_s else busy

    async def _watch(self) -> None:
        """Preempt the newest lines beyond the current limit (live traffic came). It sleeps while no line is in
        flight: polling every 10 ms with nothing to watch woke the event loop 100 times a second, and each wake-up
        took a core from a decode step's OpenMP threads."""
        while True:
            if not self.flights:
                self._flying.clear()
                await self._flying.wait()
            live = [(f.started, t) for t, f in self.flights.items() if not f.preempted]
            excess = len(live) - self.limit() if live else 0
            if excess > 0:
                for _, task in sorted(live, key=lambda p: p[0], reverse=True)[:excess]:
                    self.flights[task].preempted = True
                    task.cancel()
            await asyncio.sleep(_POLL_S)

    async def _acquire(self, job: BatchJob, tokens: int) -> bool:
        """Wait for a free line slot and for room in the key's tpm; False when the batch stops first."""
        while not self._stopping(job):
            if len(self.flights) >= self.limit():
                await asyncio.sleep(_POLL_S)
            elif await self._within_tpm(job, tokens):
                return True
            else:
                await asyncio.sleep(_TPM_POLL_S)
        return False

    def _tokens(self, job: BatchJob, line: Line) -> int:
        policy = self._key(job)
        return estimate_tokens(line.body, policy) if policy is not None and policy.tpm else 0

    async def _within_tpm(self, job: BatchJob, tokens: int) -> bool:
        policy = self._key(job)
        if policy is None or not policy.tpm or self.tokens_left is None:
            return True
        left = await self.tokens_left(policy)
        if left is None:
            return True
        held = sum(f.tokens for f in self.flights.values() if f.job.tenant == job.tenant)
        return left > 0 and (held == 0 or held + tokens <= left)

    def _stopping(self, job: BatchJob) -> bool:
        return job.cancel_requested or time.time() >= job.obj["expires_at"]

    # ---- one batch -----------------------------------------------------------------------------------

    async def _run(self, job: BatchJob) -> None:
        try:
            if job.status == "validating":
                await self._validate(job)
            if job.status == "in_progress":
                await self._execute(job)
            if job.status == "cancelling":
                await self._finalize(job, "cancelled")
            elif job.status == "finalizing":
                await self._finalize(job, "expired" if job.obj.get("expired_at") else "completed")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.logger.error("batch_error", batch_id=job.id, exc_info=exc)
            error = {"code": "internal_error", "message": "The batch stopped on an internal error.", "param": None, "line": None}
            job.set_status("failed", errors={"object": "list", "data": [error]})
            self.metrics.batches.labels("failed").inc()
        finally:
            self.tasks.pop(job.id, None)

    async def _validate(self, job: BatchJob) -> None:
        endpoint = job.obj["endpoint"]
        key = self._key(job)
        if job.cancel_requested:
            return
        check = lambda model: self.model_error(endpoint, model, key)  # noqa: E731
        # a 50,000-line file: off the event loop
        parsed = await asyncio.to_thread(parse_input, job.dir / "input.jsonl", endpoint, self.cfg.max_lines, check)
        if job.cancel_requested:
            return
        counts = {"total": len(parsed.lines) + len(parsed.errors), "completed": 0, "failed": 0}
        if parsed.errors:
            job.set_status("failed", errors={"object": "list", "data": parsed.errors}, request_counts=counts)
            self.metrics.batches.labels("failed").inc()
            self.logger.info("batch_failed_validation", batch_id=job.id, errors=len(parsed.errors))
            return
        job.set_status("in_progress", model=parsed.model, request_counts=counts)

    def _key(self, job: BatchJob) -> KeyPolicy | None:
        """The policy of the key that created the batch (None: anonymous, or a key no longer configured)."""
        return None if job.tenant == ANONYMOUS else self.policy_of(job.tenant)

    async def _execute(self, job: BatchJob) -> None:
        job.open_progress()
        if job.tenant != ANONYMOUS and self._key(job) is None:
            error = {"code": "invalid_api_key", "message": "The batch's API key is no longer accepted.", "line": None}
            job.set_status("failed", errors={"object": "list", "data": [error]})
            self.metrics.batches.labels("failed").inc()
            return
        endpoint, path = job.obj["endpoint"], job.dir / "input.jsonl"
        lines = (await asyncio.to_thread(parse_input, path, endpoint, self.cfg.max_lines, lambda _m: None)).lines
        pending = deque(line for line in lines if line.custom_id not in job.done)
        self.queued += len(pending)
        running: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping(job):
                if not pending:
                    if not running:
                        break
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)  # a preempted line may come back
                    continue
                if not await self._acquire(job, self._tokens(job, pending[0])):
                    break
                line = pending.popleft()  # pending[0] still, or a preempted line put back meanwhile
                tokens = self._tokens(job, line)
                self.queued -= 1
                task = asyncio.create_task(self._send(job, line))
                self.flights[task] = _Flight(job, line, pending, time.monotonic(), tokens)
                self._flying.set()
                running.add(task)
                task.add_done_callback(self._landed)
                task.add_done_callback(running.discard)
            await self._drain(job, running)
        finally:
            self.queued -= len(pending)
        if job.cancel_requested:
            return  # status is cancelling: _run finalizes as cancelled
        if pending:  # expired with lines never run: OpenAI writes them to the error file
            for line in pending:
                error = {"code": "batch_expired", "message": "This line was not executed because the batch expired."}
                record = {"id": f"batch_req_{self.new_id()}", "custom_id": line.custom_id, "response": None, "error": error}
                job.record(record, False)
            job.obj["expired_at"] = int(time.time())
        job.set_status("finalizing")

    async def _drain(self, job: BatchJob, running: set[asyncio.Task[None]]) -> None:
        """Wait for the lines in flight; on cancel, at most `cancel_grace_s`, then abort the rest."""
        if running and job.cancel_requested:
            await asyncio.wait(running, timeout=self.cfg.cancel_grace_s)
            for task in running:
                task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    def _landed(self, task: asyncio.Task[None]) -> None:
        """A line's task ended. A done callback, not an `except` in the task: a task cancelled before it
        ever ran raises nothing inside its coroutine, and its line must still be queued again."""
        flight = self.flights.pop(task)
        if task.cancelled() and flight.preempted:  # our own abort for live traffic: run it again later
            flight.pending.appendleft(flight.line)
            self.queued += 1
            self.metrics.preempted.inc()

    async def _send(self, job: BatchJob, line: Line) -> None:
        endpoint = job.obj["endpoint"]
        body = dict(line.body)
        if self.takes_priority(endpoint, str(body.get("model"))):
            body["priority"] = self.cfg.priority  # the lowest: behind every live request
        policy = self._key(job)
        # The key's own header where the configuration holds the key (the line shares its cache namespace); a key
        # configured only as sha256:<hex> has no header to send, so its lines neither read nor write the cache.
        known = policy is not None and not policy.key.startswith(SHA256_PREFIX)
        authorization = f"Bearer {policy.key}" if known and policy is not None else None
        unavailable = 0
        while True:
            request_id = self.new_id()
            reply = await call(self.handlers[endpoint], endpoint, body, authorization, policy=policy, request_id=request_id,
                spend=self.spend)
            spent = isinstance(reply.body, dict) and (reply.body.get("error") or {}).get("code") == "insufficient_quota"
            retry = (reply.status == 429 and not spent) or (reply.status == 503 and unavailable < 5)  # a budget: no wait
            if not retry or self._stopping(job):
                break
            unavailable += reply.status == 503
            try:
                wait = float(reply.headers.get("retry-after", self.cfg.retry_s))
            except ValueError:
                wait = self.cfg.retry_s
            await asyncio.sleep(min(max(wait, 0.05), 60.0))
        ok = 200 <= reply.status < 300
        record = {
            "id": f"batch_req_{self.new_id()}",
            "custom_id": line.custom_id,
            "response": {"status_code": reply.status, "request_id": request_id, "body": reply.body},
            "error": None,
        }
        if not self._stopping(job) or ok:
            job.record(record, ok)
            self.metrics.done.labels("completed" if ok else "failed").inc()

    async def _finalize(self, job: BatchJob, final: str) -> None:
        """Publish out.jsonl / err.jsonl as the batch's output and error files, then the final status."""
        job.open_progress()
        assert job.out is not None and job.err is not None
        extra: dict[str, Any] = {}
        for log, kind, field in ((job.out, "output", "output_file_id"), (job.err, "error", "error_file_id")):
            if log.records:
                tmp = job.dir / f"{kind}.publish"
                tmp.write_bytes(log.path.read_bytes())
                file_id = f"file-{job.id.removeprefix('batch_')}{kind[0]}"  # the same id if a restart publishes again
                name = f"{job.id}_{kind}.jsonl"
                self.files.create(job.tenant, name, "batch_output", Path(tmp), file_id=file_id, expires_s=job.output_expiry_s)
                extra[field] = file_id
        job.set_status(final, **extra)
        job.close()
        self.metrics.batches.labels(final).inc()
        self.logger.info("batch_done", batch_id=job.id, status=final, **job.obj["request_counts"])
