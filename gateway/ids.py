"""Unique ids without a syscall per request: a random per-app prefix plus a counter."""

from __future__ import annotations

import itertools
import secrets


class IdGenerator:
    def __init__(self) -> None:
        self._prefix = secrets.token_hex(10)
        self._counter = itertools.count(1)

    def new(self) -> str:
        """32 hex characters, unique within this process and (by the random prefix) across restarts."""
        return f"{self._prefix}{next(self._counter):012x}"
