"""A short content hash of a file. It names a fine-tuned encoder (backend/embed/tuned.py) both in the embedder's
identity and in the learned matcher's model file (gateway/cache/matcher.py), which must agree; torch-free, so the
gateway reads it too."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]
