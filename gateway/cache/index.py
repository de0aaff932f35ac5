"""SemanticIndex: unit vectors of cached questions, searched by cosine with one matrix product.

numpy only (no torch). Rows live in one growing float32 matrix; a removed entry's row is
zeroed (it can never score above a positive threshold) and reclaimed by compaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Candidate:
    key: str  # the exact-cache key of the entry holding the answer
    text: str  # the question that was cached
    similarity: float


OFFLOAD_ROWS = 16384  # beyond this many rows a search runs in a worker thread (numpy releases the GIL)


async def search_off_loop(index: SemanticIndex, vector: Sequence[float], k: int, floor: float) -> list[Candidate]:
    """Small indexes are searched inline (microseconds); big ones off the event loop."""
    if len(index) < OFFLOAD_ROWS:
        return index.search(vector, k, floor)
    return await asyncio.to_thread(index.search, vector, k, floor)


class SemanticIndex:
    def __init__(self, dimensions: int, max_rows: int) -> None:
        self.dimensions = dimensions
        self.max_rows = max_rows
        self._matrix = np.zeros((64, dimensions), dtype=np.float32)
        self._keys: list[str | None] = []
        self._texts: list[str] = []
        self._rows: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, key: str, text: str, vector: Sequence[float] | np.ndarray) -> None:
        """Insert or replace; the oldest rows go first when the index is full."""
        self.remove(key)
        if len(self._keys) >= self.max_rows:
            self._drop_oldest(max(1, self.max_rows // 4))
        row = len(self._keys)
        if row == self._matrix.shape[0]:
            grown = np.zeros((row * 2, self.dimensions), dtype=np.float32)
            grown[:row] = self._matrix
            self._matrix = grown
        self._matrix[row] = np.asarray(vector, dtype=np.float32)
        self._keys.append(key)
        self._texts.append(text)
        self._rows[key] = row

    def remove(self, key: str) -> None:
        row = self._rows.pop(key, None)
        if row is not None:
            self._matrix[row] = 0.0
            self._keys[row] = None

    def search(self, vector: Sequence[float] | np.ndarray, k: int, floor: float) -> list[Candidate]:
        """Up to k entries with cosine >= floor, best first.

        Safe to run in a worker thread while the event loop adds or removes entries: it reads a
        snapshot (add appends beyond it or reallocates, compaction builds new lists, remove only
        blanks a row, and a blanked row is skipped).
        """
        matrix, keys, texts = self._matrix, self._keys, self._texts
        n = len(keys)
        if n == 0:
            return []
        sims = matrix[:n] @ np.asarray(vector, dtype=np.float32)
        top = np.argpartition(-sims, k - 1)[:k] if n > k else np.arange(n)
        out = []
        for row in sorted(top.tolist(), key=lambda r: -sims[r]):
            key = keys[row]
            if key is not None and sims[row] >= floor:
                out.append(Candidate(key, texts[row], float(sims[row])))
        return out

    def _drop_oldest(self, count: int) -> None:
        keep = [i for i, key in enumerate(self._keys) if key is not None][count:]
        matrix = np.zeros((max(64, len(keep) * 2), self.dimensions), dtype=np.float32)
        matrix[: len(keep)] = self._matrix[keep]
        self._matrix = matrix
        self._keys = [self._keys[i] for i in keep]
        self._texts = [self._texts[i] for i in keep]
        self._rows = {key: row for row, key in enumerate(self._keys) if key is not None}
