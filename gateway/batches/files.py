"""The file store behind /v1/files: <dir>/files/<tenant>/<file_id>.json (the File object) and .data (the bytes)."""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from gateway.batches.storage import new_id, read_json, write_json
from gateway.errors import NotFound

_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
PURPOSES = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "files"

    def _dir(self, tenant: str) -> Path:
        path = self.root / tenant
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create(self, tenant: str, filename: str, purpose: str, src: Path, file_id: str | None = None) -> dict[str, Any]:
        """Move `src` (a finished temporary file on the same disk, or a batch's result) in as a new file."""
        file_id = file_id or new_id("file-")
        d = self._dir(tenant)
        data = d / f"{file_id}.data"
        try:
            os.replace(src, data)
        except OSError:  # another filesystem
            shutil.copyfile(src, data)
        meta = {
            "id": file_id,
            "object": "file",
            "bytes": data.stat().st_size,
            "created_at": int(time.time()),
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }
        write_json(d / f"{file_id}.json", meta)
        return meta

    def temp_path(self, tenant: str) -> Path:
        return self._dir(tenant) / f".upload-{new_id('')}"

    def get(self, tenant: str, file_id: str) -> dict[str, Any]:
        path = self.root / tenant / f"{file_id}.json"
        if not _ID.fullmatch(file_id) or not path.is_file():
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return read_json(path)

    def data_path(self, tenant: str, file_id: str) -> Path:
        meta = self.get(tenant, file_id)
        return self.root / tenant / f"{meta['id']}.data"

    def list(self, tenant: str, purpose: str | None = None) -> list[dict[str, Any]]:
        d = self.root / tenant
        if not d.is_dir():
            return []
        out = []
        for path in d.glob("*.json"):
            try:
                meta = read_json(path)
            except (OSError, ValueError):
                continue
            if purpose is None or meta.get("purpose") == purpose:
                out.append(meta)
        return out

    def delete(self, tenant: str, file_id: str) -> dict[str, Any]:
        meta = self.get(tenant, file_id)
        d = self.root / tenant
        (d / f"{meta['id']}.json").unlink(missing_ok=True)
        (d / f"{meta['id']}.data").unlink(missing_ok=True)
        return {"id": meta["id"], "object": "file", "deleted": True}
