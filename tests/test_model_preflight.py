"""A model the engine cannot serve is refused before any conversion, in milliseconds, with one line naming the path,
what was found and what is supported; `python -m gateway` exits with that line and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backend.errors import ModelLoadError, ModelNotFoundError
from backend.fetch import fetch_chat_gguf
from backend.model.arch import UnsupportedArchitecture, preflight
from backend.quant.gguf_header import GgufError, read_header

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    return fetch_chat_gguf()


def with_architecture(src: Path, dst: Path, arch: bytes) -> Path:
    """A copy of a GGUF file whose general.architecture value is `arch` (same length as the original's)."""
    data = bytearray(src.read_bytes())
    key = data.find(b"general.architecture")
    at = data.find(b"llama", key)
    assert len(arch) == 5 and key > 0 and at - key < 40
    data[at : at + 5] = arch
    dst.write_bytes(bytes(data))
    return dst


def test_header_of_the_shipped_gguf(smollm2_gguf: Path) -> None:
    t0 = time.perf_counter()
    header = read_header(smollm2_gguf)
    assert time.perf_counter() - t0 < 5  # milliseconds here; generous for a loaded CI machine
    assert header.architecture == "llama" and header.model_type == "llama"
    assert header.tensor_types == {"Q4_1": 210, "Q8_0": 1, "F32": 61}  # SmolLM2-135M's Q4_1 file, counted by gguf-py
    assert header.array_lengths["tokenizer.ggml.tokens"] == 49152
    assert header.chat_template is not None and "<|im_start|>" in header.chat_template
    assert header.metadata["llama.context_length"] == 8192


def test_unsupported_architecture_is_one_line(smollm2_gguf: Path, tmp_path: Path) -> None:
    odd = with_architecture(smollm2_gguf, tmp_path / "odd.gguf", b"falcn")
    with pytest.raises(UnsupportedArchitecture) as err:
        preflight(odd)
    assert str(err.value) == "odd.gguf: GGUF architecture 'falcn' is not supported; supported: llama, qwen2, qwen3, gemma3, phi3"


def test_missing_truncated_and_foreign_files_name_the_path(smollm2_gguf: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"nope\.gguf"):
        preflight(tmp_path / "nope.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(smollm2_gguf.read_bytes()[:100_000])  # inside the tokenizer's arrays
    with pytest.raises(GgufError, match=r"cut\.gguf: the GGUF header is cut short"):
        preflight(cut)
    foreign = tmp_path / "foreign.gguf"
    foreign.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GgufError, match=r"foreign\.gguf: not a GGUF file"):
        preflight(foreign)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "falcon"}')
    with pytest.raises(UnsupportedArchitecture, match="unsupported model type 'falcon'"):
        preflight(folder)
    assert issubclass(GgufError, ModelLoadError)


def test_gateway_exits_with_the_line_and_no_traceback(smollm2_gguf: Path, tmp_path: Path) -> None:
    odd = with_architecture(smollm2_gguf, tmp_path / "odd.gguf", b"falcn")
    env = {**os.environ, "SMOLGATE_MODEL": str(odd)}
    proc = subprocess.run([sys.executable, "-m", "gateway", "--port", "0"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["model error: odd.gguf: GGUF architecture 'falcn' is not supported; "
                     "supported: llama, qwen2, qwen3, gemma3, phi3"]
