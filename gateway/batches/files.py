"""The file store behind /v1/files: <dir>/files/<tenant>/<file_id>.json (the File object) and .data (the bytes).

A file may expire (`expires_at`, OpenAI's `expires_after`): from that second on it answers 404 as if deleted,
and it is deleted when it is next read or listed, or by `sweep` (run at startup and every `sweep_s`)."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from gateway.batches.storage import new_id, read_json, write_json
from gateway.errors import InvalidRequest, NotFound

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")
MAX_EXPIRY_S = 30 * 24 * 3600  # OpenAI's bound on expires_after.seconds (its minimum is `min_expiry_s`)
_STALE_UPLOAD_S = 24 * 3600  # an .upload-* temporary this old was left by a killed process


def expiry_seconds(value: object, param: str, min_s: int) -> int:
    """The `seconds` of an `expires_after` object ({"anchor": "created_at", "seconds": N}), checked as OpenAI does."""
    if not isinstance(value, dict) or value.get("anchor") != "created_at":
        raise InvalidRequest(f"'{param}' must be an object with anchor 'created_at' and 'seconds'.", param=param)
    seconds = value.get("seconds")
    if isinstance(seconds, str) and seconds.strip().isdigit():  # a multipart form field is a string
        seconds = int(seconds)
    if not isinstance(seconds, int) or isinstance(seconds, bool) or not min_s <= seconds <= MAX_EXPIRY_S:
        raise InvalidRequest(f"'{param}.seconds' must be an integer from {min_s} to {MAX_EXPIRY_S}.", param=f"{param}.seconds")
    return seconds


def _expired(meta: dict[str, Any], now: float) -> bool:
    expires_at = meta.get("expires_at")
    return isinstance(expires_at, int | float) and expires_at <= now


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "files"

    def _dir(self, tenant: str) -> Path:
        path = self.root / tenant
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create(
        self, tenant: str, filename: str, purpose: str, src: Path, *, file_id: str | None = None, expires_s: int | None = None
    ) -> dict[str, Any]:
        """Move `src` (a finished temporary file on the same disk, or a batch's result) in as a new file;
        `expires_s`: it expires this long after now (its created_at)."""
        file_id = file_id or new_id("file-")
        d = self._dir(tenant)
        data = d / f"{file_id}.data"
        try:
            os.replace(src, data)
        except OSError:  # another filesystem
            shutil.copyfile(src, data)
        created = int(time.time())
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": data.stat().st_size,
            "created_at": created,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": created + expires_s if expires_s else None,
            "status_details": None,
        }
        write_json(d / f"{file_id}.json", meta)
        return meta

    def temp_path(self, tenant: str) -> Path:
        return self._dir(tenant) / f".upload-{new_id('')}"

    def get(self, tenant: str, file_id: str) -> dict[str, Any]:
        path = self.root / tenant / f"{file_id}.json"
        meta = _read(path) if _ID.fullmatch(file_id) and path.is_file() else None
        if meta is not None and _expired(meta, time.time()):
            self._remove(path.parent, file_id)
            meta = None
        if meta is None:
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return meta

    def data_path(self, tenant: str, file_id: str) -> Path:
        meta = self.get(tenant, file_id)
        return self.root / tenant / f"{meta['id']}.data"

    def list(self, tenant: str, purpose: str | None = None) -> list[dict[str, Any]]:
        d = self.root / tenant
        if not d.is_dir():
            return []
        out, now = [], time.time()
        for path in d.glob("*.json"):
            meta = _read(path)
            if meta is None:
                continue
            if _expired(meta, now):
                self._remove(d, path.stem)
            elif purpose is None or meta.get("purpose") == purpose:
                out.append(meta)
        return out

    def delete(self, tenant: str, file_id: str) -> dict[str, Any]:
        meta = self.get(tenant, file_id)
        self._remove(self.root / tenant, meta["id"])
        return {"id": meta["id"], "object": "file", "deleted": True}

    def sweep(self) -> int:
        """Delete every expired file of every tenant (and upload temporaries a killed process left); how many files."""
        if not self.root.is_dir():
            return 0
        now, removed = time.time(), 0
        for path in self.root.glob("*/*.json"):
            meta = _read(path)
            if meta is not None and _expired(meta, now):
                self._remove(path.parent, path.stem)
                removed += 1
        for tmp in self.root.glob("*/.upload-*"):
            try:
                if now - tmp.stat().st_mtime > _STALE_UPLOAD_S:
                    tmp.unlink()
            except OSError:
                continue
        return removed

    @staticmethod
    def _remove(d: Path, file_id: str) -> None:
        """The object first: a reader never finds metadata whose bytes are gone."""
        (d / f"{file_id}.json").unlink(missing_ok=True)
        (d / f"{file_id}.data").unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        meta = read_json(path)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None
