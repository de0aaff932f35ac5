"""The ledger: each row is appended to the journal on the request path (gateway/spend/journal.py: durable once
the response is sent), and copied into the database by one writer thread, in batches, so that a slow disk or
database never delays an answer. A segment file is removed once every row in it is committed; at startup the
segments a dead process left are replayed first (rows already there are skipped)."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    def __init__(self, cfg: LedgerConfig, logger: Any, store: Callable[[], LedgerStore] | None = None) -> None:
        self.cfg = cfg
        self.logger = logger
        self._connect = store or (lambda: open_store(cfg.url, cfg.sqlite_path))
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._store = self._connect()  # the writer thread's (a failed connection stops startup: a clear error)
        self._reader: LedgerStore | None = None
        self._read_lock = threading.Lock()
        self.replayed = self._replay()
        self.journal = Journal(cfg.path, cfg.journal_segment_bytes)
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
        """Wait until every row recorded so far is committed (blocking: call it off the event loop)."""
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout_s)

    def read(self, fn: Callable[[LedgerStore], Any]) -> Any:
        """`fn` on a reading connection (blocking: call it off the event loop)."""
        with self._read_lock:
            if self._reader is None:
                self._reader = self._connect()
            return fn(self._reader)

    # ---- the writer thread ---------------------------------------------------------------------------------

    def _replay(self) -> int:
        count = 0
        for path, fd in orphans(self.cfg.path):
            try:
                rows = read_rows(path)
                for i in range(0, len(rows), _BATCH):
                    self._store.insert(rows[i : i + _BATCH])
                count += len(rows)
                path.unlink()
            finally:
                os.close(fd)
        if count:
            self.logger.info("ledger_replayed", rows=count)
        return count

    def _run(self) -> None:
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
        while rows:
            try:
                self._store.insert(rows)
                return
            except Exception as exc:
                self.failures += 1
                self.logger.warning("ledger_write_failed", error=type(exc).__name__, rows=len(rows))
                time.sleep(_RETRY_S)
                try:
                    self._store.close()
                    self._store = self._connect()
                except Exception:
                    continue

    def close(self) -> None:
        """Commit what is queued, stop the writer, remove the last segment (its rows are all in)."""
        self._queue.put(_Closed(self.journal.current))
        self._queue.put(None)
        self._thread.join(timeout=30)
        for store in (self._store, self._reader):
            if store is not None:
                store.close()
