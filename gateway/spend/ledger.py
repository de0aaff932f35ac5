"""The ledger: each row is appended to the journal on the request path (gateway/spend/journal.py: durable once
the response is sent), and copied into the database by one writer thread, in batches, so that a slow disk or
database never delays an answer. A segment file is removed once every row in it is committed; at startup the
segments a dead process left are replayed first (rows already there are skipped)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.ops.access_log import Logger
from gateway.spend.config import LedgerConfig
from gateway.spend.journal import Journal, Segment, orphans, read_rows
from gateway.spend.rows import LedgerRow
from gateway.spend.stores import LedgerStore, open_store

_BATCH = 2048  # rows per transaction at most
_LINGER_S = 0.05  # the writer waits this long after a row for more before committing
_RETRY_S = 1.0  # after a failed commit (the database is down): the rows stay in the journal meanwhile


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class _Closed:
    def __init__(self, segment: Segment) -> None:
        self.segment = segment


class Ledger:
    def __init__(self, cfg: LedgerConfig, logger: Logger, store: Callable[[], LedgerStore] | None = None) -> None:
        self.cfg = cfg
        self.logger = logger
        self._connect = store or (lambda: open_store(cfg.url, cfg.sqlite_path))
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._store: LedgerStore | None = None  # the writer thread's; it connects (and retries) itself
        self._reader: LedgerStore | None = None
        self._read_lock = threading.Lock()
        self.replayed = 0
        self.journal = Journal(cfg.path, cfg.journal_segment_bytes)  # ours is locked before the writer looks for orphans
        self.failures = 0
        self._thread = threading.Thread(target=self._run, name="ledger-writer", daemon=True)
        self._thread.start()

    # ---- the request path ----------------------------------------------------------------------------------

    def record(self, row: LedgerRow) -> None:
        """Journal the row (one write) and hand it to the writer thread."""
        segment, closed = self.journal.append(row)
        self._queue.put((segment, row))
        if closed is not None:
            self._queue.put(_Closed(closed))

    # ---- reading -------------------------------------------------------------------------------------------

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every row recorded so far, and a dead process's journal, is committed (blocking: call it off
        the event loop). False when that took longer (the database is unreachable)."""
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout_s)

    def read(self, fn: Callable[[LedgerStore], Any]) -> Any:
        """`fn` on a reading connection (blocking: call it off the event loop); a failed one is opened anew next time."""
        with self._read_lock:
            if self._reader is None:
                self._reader = self._connect()
            try:
                return fn(self._reader)
            except Exception:
                with contextlib.suppress(Exception):
                    self._reader.close()
                self._reader = None
                raise

    # ---- the writer thread ---------------------------------------------------------------------------------

    def _connected(self) -> LedgerStore:
        """The writer's connection, (re)opened until the database answers: a database down at startup or later
        delays the rows (they wait in the journal), never the gateway."""
        while self._store is None:
            try:
                self._store = self._connect()
            except Exception as exc:
                self.failures += 1
                self.logger.warning("ledger_unavailable", error=type(exc).__name__)
                time.sleep(_RETRY_S)
        return self._store

    def _replay(self) -> int:
        """Copy the journal files a dead process left into the database, then remove them."""
        count = 0
        for path, fd in orphans(self.cfg.path):
            try:
                rows = read_rows(path)
                for i in range(0, len(rows), _BATCH):
                    self._commit(rows[i : i + _BATCH])
                count += len(rows)
                path.unlink()
            finally:
                os.close(fd)
        if count:
            self.logger.info("ledger_replayed", rows=count)
        return count

    def _run(self) -> None:
        self._connected()  # the schema, now (and a database down at startup is logged at once)
        self.replayed = self._replay()  # before the queue: a flush includes the rows replayed
        stop = False
        while not stop:
            items = [self._queue.get()]
            # Let rows gather: one transaction per batch, and this thread wakes (and takes the GIL from the event
            # loop) a few times a second rather than once per request. The journal already holds them.
            if self._queue.qsize() < _BATCH:
                time.sleep(_LINGER_S)
            while len(items) < _BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows = [item[1] for item in items if isinstance(item, tuple)]
            if rows:
                self._commit(rows)
            for item in items:
                if isinstance(item, _Closed):  # every row before this marker is committed
                    item.segment.close()
                    Path(item.segment.path).unlink(missing_ok=True)
                elif isinstance(item, _Flush):
                    item.done.set()
                elif item is None:
                    stop = True

    def _commit(self, rows: list[LedgerRow]) -> None:
        while True:
            store = self._connected()
            try:
                store.insert(rows)
                return
            except Exception as exc:
                self.failures += 1
                self.logger.warning("ledger_write_failed", error=type(exc).__name__, rows=len(rows))
                with contextlib.suppress(Exception):
                    store.close()
                self._store = None
                time.sleep(_RETRY_S)

    def close(self) -> None:
        """Commit what is queued, stop the writer, remove the last segment (its rows are all in)."""
        self._queue.put(_Closed(self.journal.current))
        self._queue.put(None)
        self._thread.join(timeout=30)
        if self._thread.is_alive():  # the database is still away: the rows stay in the journal for the next start
            self.logger.warning("ledger_not_flushed", detail="rows left in the journal are replayed at the next start")
            return
        for store in (self._store, self._reader):
            if store is not None:
                store.close()
