"""llama.cpp's source, as llama-cpp-python's source package on PyPI carries it (pinned), unpacked once into the cache.

    python -m bench.llama_cpp_src [--dest DIR] [--all]

By default only the HF-to-GGUF converter (convert_hf_to_gguf.py, conversion/, gguf-py/): tests/test_phi3_gguf.py
writes Phi-3 GGUF files with it, as users' files are made (`make test` exports SMOLGATE_LLAMA_CPP). `--all` unpacks the
whole tree, to build llama.cpp's server as docs/benchmarks.md says. pip downloads the archive and checks its SHA-256
against the pin. Prints the tree's path last.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from backend.config import cache_dir

VERSION = "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
CONVERTER = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def sdist(into: Path) -> Path:
    """Download llama-cpp-python's pinned source archive into `into` with pip (its index, its proxy settings), the
    archive's SHA-256 checked against the pin."""
    pin = into / "requirements.txt"
    pin.write_text(f"llama-cpp-python=={VERSION} --hash=sha256:{SHA256}\n")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(into),
                    "-r", str(pin)], check=True, stdout=sys.stderr)  # stdout: the path alone
    return next(into.glob("llama_cpp_python-*.tar.gz"))


def unpack(archive: Path, dest: Path, *, whole: bool) -> None:
    """vendor/llama.cpp/ of the archive into dest: the converter's files, or everything."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            root, _, rest = member.name.partition("/vendor/llama.cpp/")
            if not rest or "/" in root or not (whole or rest.startswith(CONVERTER)):
                continue
            member.name = rest
            tar.extract(member, dest, filter="data")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.llama_cpp_src", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=None, help="default: the cache folder's llama.cpp-VERSION")
    ap.add_argument("--all", action="store_true", help="the whole source tree, not just the converter")
    args = ap.parse_args(argv)
    dest = args.dest or cache_dir() / f"llama.cpp-{VERSION}"
    done = dest / (".unpacked-all" if args.all else ".unpacked-converter")
    if not done.exists():
        with tempfile.TemporaryDirectory() as tmp:
            unpack(sdist(Path(tmp)), dest, whole=args.all)
        done.touch()
    print(dest)


if __name__ == "__main__":
    main()
