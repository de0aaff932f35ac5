"""Configuration below both layers: the engine's frozen dataclass, the configuration file, and the command line.

The engine reads its settings here and nowhere else; so does the gateway, whose own sections (gateway/config.py)
build on the file reader and the type checks below. Both layers import this module, which imports neither: the
parallel workers (backend/parallel/driver.py) read the same file as the server on rank 0 without the gateway.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

ENV_PREFIX = "SMOLGATE_"
QUANTIZATIONS = ("auto", "awq", "none", "int8")


def cache_dir() -> Path:
    """Where fetched and converted models live (SMOLGATE_CACHE, default ~/.cache/smolgate)."""
    return Path(os.environ.get(f"{ENV_PREFIX}CACHE", Path.home() / ".cache" / "smolgate")).expanduser()


def default_model_path() -> Path:
    return cache_dir() / "models" / "SmolLM2-135M-Instruct"


def default_awq_model_path() -> Path:
    """The default chat model quantized once to AWQ INT4 by `python -m backend.fetch`. Same folder name as the
    full-precision copy, so the served model name does not change with the quantization."""
    return cache_dir() / "models" / "awq" / "SmolLM2-135M-Instruct"


def default_gguf_model_path() -> Path:
    """The default chat model's shipped GGUF Q4_1 blocks as they are (backend/quant/gguf_blocks.py), written once by
    `python -m backend.fetch` in seconds; what `quantization: auto` serves. Same folder name as the other copies."""
    return cache_dir() / "models" / "gguf" / "SmolLM2-135M-Instruct"


def default_medusa_path() -> Path:
    """Medusa heads self-distilled for the default model by `python -m backend.spec.medusa_train`."""
    return cache_dir() / "medusa" / "SmolLM2-135M-Instruct"


def default_embedding_model_path() -> Path:
    return cache_dir() / "models" / "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to know; defaults fit SmolLM2-135M on a 2-core CPU."""

    model: str = ""  # HF directory or .gguf file; "" means the default fetched model
    # Which copy of the default model "" serves: auto (the shipped GGUF's Q4_1 blocks as they are: INT4, no
    # re-quantization) | awq (the full-precision copy quantized once with AWQ, backend/quant) | none (full precision) |
    # int8 (the full-precision copy, projections quantized to per-channel INT8 at load time).
    # An explicit `model` loads as its checkpoint says (AWQ/GPTQ detected from config.json); a .gguf file with auto
    # serves its Q4_0/Q4_1 blocks as they are (dequantized with the other values); int8 applies to it too.
    quantization: str = "auto"
    # INT4 on CPU: also keep a dense copy of the weights for batched steps (2x faster from ~10 rows on; bf16 where
    # native, +2 bytes per weight, else fp32, +4); off serves every call from the int4 kernel (smallest memory).
    int4_dense_copy: bool = True
    # INT4 on CPU: auto (the W4A8 kernel, kernels/cpu/w4a8.c, where it builds, x86 AVX2 + a C compiler, and the CPU
    # has no native bf16; then the int4 weights are the only copy) | w4a8 (required: an error if it cannot build) |
    # torch (torch's int4 kernel + the dense copy above; auto's choice on AVX-512 BF16 / AMX CPUs)
    int4_cpu_kernel: str = "auto"
    # Batch-invariant numerics (docs/determinism.md): a sequence's logits are bit-identical whatever else runs in the
    # batch and however its tokens got there (whole or chunked prefill, prefix cache, preemption, speculative
    # verification), so greedy and seeded outputs repeat. On CPU int4_cpu_kernel auto then takes the W4A8 kernel
    # wherever it builds, and INT8 weights run on the W8A8 kernel (one reduction order per row at any row count);
    # off: torch's int4/int8 kernels with dense copies for batches on bf16 CPUs (faster prefill, batch-dependent bits).
    deterministic: bool = True
    # Full-precision weights on CPU: also keep a oneDNN-prepacked copy for calls with 2+ rows (prefill, batches,
    # speculative verify): 1.15x at 32 streams, ~2x for a 5-row lm_head call (backend/quant/cpu_gemm.py); 2x the memory.
    packed_copy: bool = True
    # The LM head's weights on 2 MB pages where Linux allows it (backend/quant/huge_pages.py): read whole every step;
    # Gemma 3's decode steps 1.03-1.15x faster on a Zen 4 (bench/huge_pages.py); the same bytes
    huge_pages: bool = True
    served_model_name: str = ""  # "" -> the directory name
    # The chat template: "" the model's own; a family's standard one by name (gemma, chatml) or a Jinja file's path, for
    # a model whose tokenizer has none (a GGUF base model); its end-of-turn token then ends a chat answer too
    chat_template: str = ""
    dtype: str = "float32"  # float32 | bfloat16 | float16
    device: str = "auto"  # auto -> cuda when available, else cpu
    block_size: int = 16
    kv_cache_memory_mb: int = 1024  # memory budget of the KV block pool
    # Where full and sliding-window layers mix (Gemma 3), the windowed layers' K/V in a pool of their own, sized by the
    # window (backend/engine/kv_cache.py); false: one pool, every layer's memory growing with the context
    kv_window_pool: bool = True
    # auto (the model's dtype; bfloat16 for INT4/INT8 weights on a CPU with native bf16) | float32 | bfloat16 | float16
    kv_cache_dtype: str = "auto"
    max_model_len: int = 0  # 0 -> the model's max_position_embeddings; more than it needs allow_long_max_model_len
    # Serve max_model_len beyond the positions the model was trained on (rope extrapolates mechanically, the
    # answers degrade past them): for protocol tests of long-prompt clients, like vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN
    allow_long_max_model_len: bool = False
    max_num_seqs: int = 64  # running sequences per step
    max_num_batched_tokens: int = 512  # per-step token budget (chunked prefill)
    max_waiting: int = 1024  # waiting-queue limit; beyond it submit raises QueueFullError
    enable_prefix_caching: bool = True
    # The longest draft per step and sequence (0 = speculation off); the adaptive policy (backend/spec/policy.py)
    # picks each sequence's source and k <= this from its recent acceptance. Verified rows are bit-identical to plain
    # decode steps on the C kernels (tests/test_batch_invariance.py), so speculation changes no token or logprob there
    num_speculative_tokens: int = 4
    # ngram (prompt lookup, no model) | draft (a draft model proposes) | medusa (heads on the target's last hidden state)
    speculative_method: str = "ngram"
    # The draft model (same vocabulary; "" -> the default model's INT4 copy, its GGUF blocks), or with medusa a heads directory in
    # the Medusa format ("" -> the self-distilled heads, default_medusa_path())
    speculative_model: str = ""
    # medusa: a draft stops at the first head whose top probability is below this (0: always k tokens); an unsure
    # guess mostly costs a verified row (bench/README.md, "Medusa heads")
    medusa_min_confidence: float = 0.5
    speculative_max_batch: int = 8  # no speculation while more sequences than this run (bench.speculative sweep)
    # What one more row costs a one-sequence decode step (fraction): a draft token is verified only when its
    # expected acceptance pays for its row, so the batch size where speculation stops follows from it
    # (bench.speculative measures it: `row_cost`); 0: always the longest draft, at any acceptance and batch size,
    # from the configured method only
    speculative_row_cost: float = 0.4
    priority_aging_s: float = 10.0  # a waiting request gains one priority level per this many seconds (0: never)
    # per-step token budget while only priority 2147483647 (batch) work is here: a live arrival waits for one such
    # step, so keep it short (0: max_num_batched_tokens)
    background_max_batched_tokens: int = 128
    tensor_parallel_size: int = 1  # > 1: shard every layer over a torch.distributed group (backend/model/tensor_parallel.py)
    pipeline_parallel_size: int = 1  # > 1: split the layers into stages, one per rank (backend/model/pipeline_parallel.py)
    # auto: Triton on CUDA; on a CPU, torch plus the project's C kernels where they build (else plain torch); plain
    # torch on other devices | torch (plain torch anywhere) | triton (on a CPU through Triton's interpreter: tests)
    kernel_backend: str = "auto"
    # On CUDA with the Triton ops: pure-decode steps replay CUDA graphs captured at start for padded batch sizes up
    # to max_num_seqs (backend/engine/cuda_graphs.py). A small model's decode step is launch-bound (~8 kernels a layer,
    # each launch tens of microseconds on the host); a graph replays them all in one call. Ignored elsewhere.
    cuda_graphs: bool = True
    num_threads: int = 0  # torch intra-op threads; 0 -> all cores
    seed: int = 0

    def resolved_model(self) -> Path:
        if self.model:
            return Path(self.model).expanduser()
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {self.quantization!r}: use auto, awq, int8 or none")
        copies = {"auto": default_gguf_model_path(), "awq": default_awq_model_path()}
        return copies.get(self.quantization, default_model_path())

    def context_len(self, trained: int) -> int:
        """The served context length, given the model's own (`max_position_embeddings`)."""
        if self.allow_long_max_model_len and self.max_model_len:
            return self.max_model_len
        return min(self.max_model_len or trained, trained)

    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"


def _parse(value: str, like: object) -> object:
    if isinstance(like, bool):
        return value.strip().lower() in {"1", "true", "yes", "on"}
    if isinstance(like, int):
        return int(value)
    if isinstance(like, float):
        return float(value)
    return value


def engine_config_from_env(base: EngineConfig | None = None, environ: dict[str, str] | None = None) -> EngineConfig:
    """Override `base` with SMOLGATE_<FIELD> variables (e.g. SMOLGATE_KV_CACHE_MEMORY_MB=2048)."""
    base = base or EngineConfig()
    env = os.environ if environ is None else environ
    changes: dict[str, Any] = {  # field name -> a value of that field's type (_parse follows the default's)
        f.name: _parse(env[f"{ENV_PREFIX}{f.name.upper()}"], getattr(base, f.name))
        for f in fields(base)
        if f"{ENV_PREFIX}{f.name.upper()}" in env
    }
    return replace(base, **changes)


class ConfigError(ValueError):
    """The configuration file or an environment variable is invalid."""


def parse_args(argv: list[str] | None, prog: str = "python -m gateway") -> argparse.Namespace:
    """The command line of `python -m gateway` (gateway/__main__.py, the composition root)."""
    parser = argparse.ArgumentParser(prog=prog, description="OpenAI-compatible LLM gateway")
    parser.add_argument("--config", help="YAML config file (default: $SMOLGATE_CONFIG)")
    parser.add_argument("--host", help="bind address (overrides $HOST and the file)")
    parser.add_argument("--port", type=int, help="port (overrides $PORT and the file)")
    parser.add_argument("--embedded-only", action="store_true",
                        help="serve the embedded engine only, ignoring any routing sections (a backend replica)")
    parser.add_argument("--parallel", choices=("tensor", "pipeline"),
                        help="under torchrun: one engine over the launched processes (rank 0 serves)")
    return parser.parse_args(argv)


def read_config_file(path: Path) -> Mapping[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def coerce(name: str, value: object, like: object) -> Any:
    """`value` from the file, checked against the type of the default `like` (an int is a valid float)."""
    if isinstance(like, bool):
        ok = isinstance(value, bool)
    elif isinstance(like, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(like, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value  # type: ignore[arg-type]
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{name} must be of type {type(like).__name__}, got {value!r}")
    return value


def engine_config_from_mapping(value: object) -> EngineConfig:
    """The file's `engine:` section."""
    if not isinstance(value, dict):
        raise ConfigError("engine must be a mapping of EngineConfig fields")
    base = EngineConfig()
    known = {f.name for f in fields(base)}
    unknown = set(value) - known
    if unknown:
        raise ConfigError(f"unknown engine config keys: {sorted(unknown)}")
    return replace(base, **{k: coerce(f"engine.{k}", v, getattr(base, k)) for k, v in value.items()})


def load_engine_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> EngineConfig:
    """The `engine:` section of the configuration file (`path` or $SMOLGATE_CONFIG), then SMOLGATE_<FIELD>
    overrides: the `engine` of gateway.config.load_config(path), read without the gateway's own sections."""
    env = os.environ if environ is None else environ
    path = path or env.get(f"{ENV_PREFIX}CONFIG") or None
    data = read_config_file(Path(path)) if path else {}
    base = engine_config_from_mapping(data["engine"]) if "engine" in data else EngineConfig()
    return engine_config_from_env(base, dict(env))
