"""One gateway per batch directory: an exclusive flock on <dir>/gateway.lock. Two gateways resuming the same
batches would run every line twice; the one that does not hold the lock stands by (its /v1/files and
/v1/batches answer 503) and takes over when the holder exits. The kernel drops the lock with the process,
also on kill -9, so a crashed holder never leaves a stale lock behind."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path


class DirLock:
    def __init__(self, root: Path) -> None:
        self.path = root / "gateway.lock"
        self._fd = -1

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def acquire(self) -> bool:
        """Take the lock if it is free (never blocks); True when this process holds it."""
        if self.held:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)  # who holds it, for the other gateways' error message
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode())
        self._fd = fd
        return True

    def holder(self) -> str:
        """Who holds the lock, as the holder wrote it ("pid N on HOST"), or "" when unknown."""
        try:
            return self.path.read_text(errors="replace").strip()[:200]
        except OSError:
            return ""

    def release(self) -> None:
        if self.held:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = -1
