"""A GGUF file's 4-bit blocks served as they are: Q4_0 / Q4_1 projections -> Int4Linear without re-quantizing.

GGUF stores a weight (out, in) row by row in blocks of 32 input channels, each with an fp16 scale d:

    Q4_1  w = d * q + m        q 0..15, m the block's fp16 minimum
    Q4_0  w = d * (q - 8)      stored here as m = -8 d (exact in fp16: a power of two)
    Q8_0  w = d * q            q int8

so a Q4_0/Q4_1 block is a group of 32 with scale d and zero term -m (w = q s - z s, the W4A8 kernel's form:
kernels/cpu/w4a8.c). `convert_gguf_blocks` writes them once into a safetensors directory, per projection:

    q4         (out, in / 2) uint8   the values in the W4A8 kernel's nibble order (64-value blocks: byte j holds
                                     value j in its low nibble and value j + 32 in its high one)
    q4_scales  (out, in / 32) fp16   d
    q4_mins    (out, in / 32) fp16   m

Every other tensor (Q8_0 embeddings, norms, any other type) is dequantized exactly as llama.cpp's reference does
(gguf-py, the same values transformers loads: `python -m backend.fetch`'s full-precision copy), in float32. A
weight whose in_features is not a multiple of 64 is dequantized too (the kernel's 64-value blocks). config.json
gets quantization_config = {quant_method: gguf_blocks, group_size: 32}.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from backend.quant.gguf_header import read_header, read_tensors

if TYPE_CHECKING:
    from transformers import PretrainedConfig

BLOCK = 32
BLOCK_TENSORS = ("q4", "q4_scales", "q4_mins")
QUANT_METHOD = "gguf_blocks"
ARCHITECTURES = {"llama", "qwen2"}  # llama.cpp permutes llama's q/k rows (undone below); qwen2 keeps HF's order
PER_LAYER = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class NoBlocksError(ValueError):
    """The GGUF file has nothing to serve as 4-bit blocks (no Q4_0/Q4_1 projections, or another architecture)."""


def hf_name(gguf_name: str) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in TOP:
        return f"{TOP[stem]}.{kind}"
    blk, layer, part = stem.split(".", 2)
    if blk != "blk" or part not in PER_LAYER:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a Llama-family model")
    return f"model.layers.{layer}.{PER_LAYER[part]}.{kind}"


def q4_blocks(raw: np.ndarray, q4_0: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0/Q4_1 tensor's raw bytes (out, blocks * block bytes) -> values (out, in) uint8, d, m (out, blocks) fp16.
    Byte j of a block's 16 holds value j (low nibble) and value j + 16 (high)."""
    out = raw.shape[0]
    blocks = torch.from_numpy(np.ascontiguousarray(raw)).view(out, -1, 18 if q4_0 else 20)
    d = blocks[..., 0:2].contiguous().view(torch.float16)[..., 0]
    m = -8 * d if q4_0 else blocks[..., 2:4].contiguous().view(torch.float16)[..., 0]
    qs = blocks[..., -16:]
    q = torch.cat([qs & 15, qs >> 4], dim=-1).reshape(out, -1)
    return q, d.contiguous(), m.contiguous()


def pack_q4(q: torch.Tensor) -> torch.Tensor:
    """(out, in) values 0..15 -> (out, in / 2) bytes in the W4A8 kernel's order (kernels/cpu/w4a8.py)."""
    n, k = q.shape
    b = q.reshape(n, k // 64, 2, 32)
    return (b[:, :, 0] | (b[:, :, 1] << 4)).reshape(n, k // 2).contiguous()


def unpack_q4(packed: torch.Tensor) -> torch.Tensor:
    n, half = packed.shape
    b = packed.reshape(n, half // 32, 32)
    return torch.stack([b & 15, b >> 4], dim=2).reshape(n, half * 2)


def dequantize_blocks(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """float32 (out, in) = d * q + m per block of 32: llama.cpp's and gguf-py's arithmetic (fp16 d, m widened, one
    product and one sum in float32), so bit-identical to the full-precision copy's weights."""
    n, k = q.shape
    w = q.float().view(n, -1, BLOCK) * d.float()[..., None] + m.float()[..., None]
    return w.view(n, k)


def _unpermute(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of q/k (transformers' reverse_permute_weights), any trailing shape."""
    return t.reshape(heads, t.shape[0] // heads // 2, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def read_gguf_blocks(gguf_path: Path, heads: int, kv_heads: int, permute: bool) -> dict[str, torch.Tensor]:
    """HF-named tensors: q4 / q4_scales / q4_mins for the Q4_0/Q4_1 projections, float32 for everything else."""
    from gguf import GGMLQuantizationType as T
    from gguf import dequantize

    state: dict[str, torch.Tensor] = {}
    for t in read_tensors(read_header(gguf_path)):
        name = hf_name(t.name)
        rows = {".attn_q.": heads, ".attn_k.": kv_heads}
        heads_of = next((h for key, h in rows.items() if key in t.name), 0) if permute else 0

        def fix(x: torch.Tensor, h: int = heads_of) -> torch.Tensor:
            return _unpermute(x, h) if h else x

        in_features = t.dims[0]
        if t.tensor_type in (T.Q4_0, T.Q4_1) and name.endswith(".weight") and in_features % 64 == 0:
            q, d, m = q4_blocks(t.data, t.tensor_type == T.Q4_0)
            stem = name.removesuffix(".weight")
            state[f"{stem}.q4"], state[f"{stem}.q4_scales"], state[f"{stem}.q4_mins"] = fix(pack_q4(q)), fix(d), fix(m)
        else:
            values = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)  # a writable copy
            state[name] = fix(torch.from_numpy(values).reshape(tuple(reversed(t.dims))))
    return state


_SHARING = threading.Lock()


@contextlib.contextmanager
def shared_gguf_readers() -> Iterator[None]:
    """Within it, gguf-py's GGUFReader is built once per file and handed out again. transformers builds one for the
    config and another for the tokenizer, and each parses every metadata array into Python objects, element by element
    (8 s each for Gemma 3's 262,144-token vocabulary on 2 cores); both only read it. One conversion at a time swaps
    the class (a lock), and it is put back on the way out."""
    import gguf

    with _SHARING:
        original = gguf.GGUFReader
        built: dict[tuple[str, str], Any] = {}

        def shared(path: str | Path, mode: str = "r") -> Any:
            key = (str(Path(path).resolve()), mode)
            if key not in built:
                built[key] = original(path, mode)  # type: ignore[arg-type]
            return built[key]

        setattr(gguf, "GGUFReader", shared)  # noqa: B010 (transformers imports it from the package at call time)
        try:
            yield
        finally:
            setattr(gguf, "GGUFReader", original)  # noqa: B010


def convert_gguf_blocks(gguf_path: Path, out: Path) -> Path:
    """Write `out`: the blocks above, config.json (marked gguf_blocks), the tokenizer; seconds, not the minutes of AWQ."""
    with shared_gguf_readers():
        return _convert_gguf_blocks(gguf_path, out)


def _convert_gguf_blocks(gguf_path: Path, out: Path) -> Path:
    from transformers import AutoConfig

    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    arch = config.model_type
    if arch not in ARCHITECTURES:
        raise NoBlocksError(f"GGUF blocks: architecture {arch!r} is not one of {sorted(ARCHITECTURES)}")
    state = read_gguf_blocks(gguf_path, config.num_attention_heads, config.num_key_value_heads, arch == "llama")
    if not any(k.endswith(".q4") for k in state):
        raise NoBlocksError(f"{gguf_path.name} has no Q4_0 / Q4_1 projections to serve as they are")
    if "lm_head.weight" not in state:
        config.tie_word_embeddings = True  # llama.cpp reads the embedding table as the output when `output` is absent
    config.quantization_config = {"quant_method": QUANT_METHOD, "bits": 4, "group_size": BLOCK}
    return write_converted(gguf_path, out, state, config)


def write_converted(gguf_path: Path, out: Path, state: dict[str, torch.Tensor], config: PretrainedConfig) -> Path:
    """`out` written whole or not at all (a `.partial` folder renamed): the tensors, config.json, the generation
    config and the GGUF's tokenizer (transformers converts it)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, GenerationConfig

    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(partial / "model.safetensors"),
              metadata={"format": "pt", "source": gguf_path.name})
    config.save_pretrained(partial)
    GenerationConfig.from_model_config(config).save_pretrained(partial)
    AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name).save_pretrained(partial)
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    return out


def quant_method(model_dir: Path) -> str | None:
    """config.json's quantization_config.quant_method (None: none, or no config.json)."""
    path = model_dir / "config.json"
    if not path.exists():
        return None
    return (json.loads(path.read_text()).get("quantization_config") or {}).get("quant_method")


def is_gguf_blocks(model_dir: Path) -> bool:
    return quant_method(model_dir) == QUANT_METHOD


def dequantize_mixed_groups(hf: dict[str, torch.Tensor], fused: Iterable[tuple[str, ...]]) -> dict[str, torch.Tensor]:
    """Projections fused into one layer (q/k/v, gate/up) must share a form: where a file mixes block types within a
    group (one part Q4_1, another Q8_0), the blocks of that group are dequantized and the group stays full precision."""
    layers = {m.group(1) for k in hf if (m := re.match(r"(layers\.\d+\.)", k))}
    for prefix in layers:
        for parts in fused:
            has = [f"{prefix}{p}.q4" in hf for p in parts]
            if any(has) and not all(has):
                for p in (p for p, h in zip(parts, has, strict=True) if h):
                    stem = f"{prefix}{p}"
                    q, d, m = (hf.pop(f"{stem}.{t}") for t in BLOCK_TENSORS)
                    hf[f"{stem}.weight"] = dequantize_blocks(unpack_q4(q), d, m)
    return hf


def as_module_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fp16 scales and minimums as their int16 bit patterns (Int4Linear's gguf layout: a dtype cast of the model
    leaves integers alone, so the blocks' values survive `model.to(bfloat16)`)."""
    return {k: v.view(torch.int16) if k.endswith((".q4_scales", ".q4_mins")) else v for k, v in state.items()}
