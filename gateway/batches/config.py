"""BatchesConfig: the `batches:` section of the gateway configuration (env SMOLGATE_BATCHES_<FIELD>)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from backend.config import cache_dir

# The largest priority the `priority` field allows: a batch line is less urgent than anything else, so live
# requests are admitted first and, under KV pressure, batch sequences are the first preempted.
BATCH_PRIORITY = 2**31 - 1


def default_dir() -> Path:
    return cache_dir() / "batches"


@dataclass(frozen=True)
class BatchesConfig:
    enabled: bool = True
    dir: str = ""  # where files and batch state live; "" = $SMOLGATE_CACHE/batches (~/.cache/smolgate/...)
    max_file_bytes: int = 200 * 1024 * 1024  # an upload beyond this gets 413 (OpenAI's limit: 200 MB)
    max_lines: int = 50_000  # requests per batch (OpenAI's limit)
    max_concurrency: int = 32  # batch lines in flight while no live request is
    busy_concurrency: int = 0  # batch lines in flight while live requests are (0: paused then; at most max_concurrency)
    idle_s: float = 0.5  # the gateway counts as idle this long after its last live request ended
    priority: int = BATCH_PRIORITY  # the engine priority of batch lines (lower is served first)
    retry_s: float = 1.0  # wait before retrying a line that got 429/503 (a Retry-After header wins)
    cancel_grace_s: float = 2.0  # on cancel, lines in flight get this long to finish before they are aborted
    batch_file_expiry_s: int = 30 * 24 * 3600  # uploads with purpose "batch" and no expires_after (OpenAI: 30 days; 0: kept)
    min_expiry_s: int = 3600  # the shortest expires_after / output_expires_after accepted (OpenAI's minimum)
    sweep_s: float = 60.0  # how often expired files are deleted (also once at startup)

    def __post_init__(self) -> None:
        if self.max_concurrency < 1 or self.busy_concurrency < 0:
            raise ValueError("batches: need max_concurrency >= 1 and busy_concurrency >= 0")
        if self.max_file_bytes < 1 or self.max_lines < 1:
            raise ValueError("batches: max_file_bytes and max_lines must be positive")
        if self.batch_file_expiry_s < 0 or self.min_expiry_s < 1 or self.sweep_s <= 0:
            raise ValueError("batches: need batch_file_expiry_s >= 0, min_expiry_s >= 1 and sweep_s > 0")

    @property
    def path(self) -> Path:
        return Path(self.dir).expanduser() if self.dir else default_dir()
