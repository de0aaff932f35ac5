"""The ledger's journal: rows appended to a file before the response's last bytes are sent, so that a gateway
killed (`kill -9`) after answering loses no row; the writer thread copies them into the database later.

One `os.write` of one JSON line per row on an O_APPEND file: no fsync (the OS keeps written data when the process
dies; only a power loss may take the last rows), no lock held across an await. Each process writes its own
segment files, holding an flock on the current one: at startup a process replays and removes only the segments
no live process holds (those of a crashed one), so replicas may share the directory.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from gateway.spend.rows import LedgerRow

PREFIX = "journal-"
SUFFIX = ".jsonl"


class Segment:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.size = 0

    def close(self) -> None:
        os.close(self.fd)  # releases the flock


class Journal:
    def __init__(self, directory: Path, segment_bytes: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.dir = directory
        self.segment_bytes = segment_bytes
        self._name = f"{PREFIX}{os.getpid()}-{time.time_ns()}"
        self._seq = 0
        self._lock = threading.Lock()  # the event loop appends; the writer thread may close old segments
        self.current = self._open()

    def _open(self) -> Segment:
        self._seq += 1
        return Segment(self.dir / f"{self._name}-{self._seq:06d}{SUFFIX}")

    def append(self, row: LedgerRow) -> tuple[Segment, Segment | None]:
        """Write one row; returns its segment and, when this row filled it, the segment just closed."""
        line = orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)  # orjson writes dataclasses natively (fast)
        with self._lock:
            segment = self.current
            os.write(segment.fd, line)
            segment.size += len(line)
            if segment.size < self.segment_bytes:
                return segment, None
            self.current = self._open()
            return segment, segment


def orphans(directory: Path) -> Iterator[tuple[Path, int]]:
    """Segments no live process holds (left by a crashed or killed one), each with an flock now held by us:
    the caller replays the file, removes it, then closes the descriptor."""
    if not directory.is_dir():
        return
    for path in sorted(directory.glob(f"{PREFIX}*{SUFFIX}")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process writes it
            os.close(fd)
            continue
        yield path, fd


def read_rows(path: Path) -> list[LedgerRow]:
    """Every complete row of a segment (a line cut by a crash mid-write is skipped: its response was not sent)."""
    rows = []
    for line in path.read_bytes().splitlines():
        try:
            rows.append(LedgerRow.from_dict(orjson.loads(line)))
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue
    return rows
