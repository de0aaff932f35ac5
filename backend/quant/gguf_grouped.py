"""A GGUF file served in its own bits: every block-quantized weight kept as the file's integers and scales.

`convert_gguf_grouped` writes, once, a safetensors directory in our HF names where each weight of a served block type
(gguf_types.SERVED: Q4_0 ... Q8_0 and the K-quants Q3_K-Q6_K) is three tensors

    <name>.gq  (out, in) int8     q
    <name>.gs  (out, in / G) fp32 the scale of each group of G = 16 or 32
    <name>.gz  (out, in / 32) fp32 the term added per group (types with a minimum only)

and everything else (norms, F32/F16 tensors, any type not served) is dequantized by gguf-py's reference, as transformers
loads it (llama's q/k rows un-permuted, Gemma's norms stored as w - 1). phi3 files hold q/k/v in one tensor
(`attn_qkv`, rows q then k then v, not permuted: llama.cpp's phi3 rotary is NeoX's, HF's rotate-half) and gate/up in
one (`ffn_up`, gate's rows first, as HF's Phi3MLP chunks it): our fused layers' own layout, kept as they are. No float
copy of a served weight is written or built: in memory a weight takes 1.06-1.25 bytes (int8 and its group's scale and
term: Q3_K, Q6_K, Q8_0, and every type on a GPU), or on a CPU 0.56-0.75 for a 4-bit type (Q4_0, Q4_1, Q4_K: two
values a byte, `nibble_offset`) and 0.69-0.88 for a 5-bit type (Q5_0, Q5_1, Q5_K: the low four bits so and a plane of
fifth bits), in GgufLinear / GgufEmbedding (gguf_linear.py). On a CPU a scale that
is the file's own fp16 d (Q8_0, Q5_0, Q5_1, Q4_0, Q4_1) is kept in fp16 (kernels/cpu/wg8a8.py `pack`); the K-quants'
d times a sub-block scale, and every term, in float32.
config.json gets quantization_config = {quant_method: gguf_grouped}.

The loader fuses q/k/v and gate/up (`harmonize` first makes the parts agree: one group size, terms on all or none,
or, where one part is dense, the fused weight dense) and swaps the layers in (`swap_in_grouped`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from backend.quant.gguf_blocks import PER_LAYER, TOP, _unpermute, quant_method, shared_gguf_readers, write_converted
from backend.quant.gguf_config import ROPE_FACTORS, gguf_config
from backend.quant.gguf_header import read_header, read_tensors
from backend.quant.gguf_linear import GgufEmbedding, GgufLinear, Grouped
from backend.quant.gguf_types import decode
from kernels.cpu.wg8a8 import GroupedInt8, lanes_of, pack

QUANT_METHOD = "gguf_grouped"
TENSORS = ("gq", "gs", "gz")
ARCHITECTURES = {"llama", "qwen2", "qwen3", "gemma3", "phi3"}  # GGUF's general.architecture names
# per-layer names beyond Llama's: QK-norm (qwen3, gemma3) and Gemma's sandwich norms, where ffn_norm is the pre-MLP one
EXTRA = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
         "post_attention_norm": "post_attention_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
GEMMA = {**EXTRA, "ffn_norm": "pre_feedforward_layernorm"}
PHI3 = {**EXTRA, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}  # fused in the file: our layout


def hf_name(gguf_name: str, arch: str) -> str:
    """blk.3.ffn_norm.weight -> model.layers.3.post_attention_layernorm.weight (gemma3: pre_feedforward_layernorm)."""
    stem, _, kind = gguf_name.rpartition(".")
    if stem in TOP:
        return f"{TOP[stem]}.{kind}"
    blk, layer, part = stem.split(".", 2)
    names = {**PER_LAYER, **{"gemma3": GEMMA, "phi3": PHI3}.get(arch, EXTRA)}
    if blk != "blk" or part not in names:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a {arch} model")
    return f"model.layers.{layer}.{names[part]}.{kind}"


def read_gguf_grouped(gguf_path: Path, arch: str, heads: int, kv_heads: int) -> dict[str, torch.Tensor]:
    """HF-named tensors: .gq/.gs/.gz for the weights of a served type, float32 for the rest."""
    from gguf import dequantize

    state: dict[str, torch.Tensor] = {}
    for t in read_tensors(read_header(gguf_path)):
        if t.name in ROPE_FACTORS:
            continue  # phi3's longrope factors: the config's (gguf_config.py)
        name = hf_name(t.name, arch)
        shape = tuple(reversed(t.dims))
        rows = {".attn_q.": heads, ".attn_k.": kv_heads}
        heads_of = next((h for key, h in rows.items() if key in t.name), 0) if arch == "llama" else 0

        def fix(x: torch.Tensor, h: int = heads_of) -> torch.Tensor:  # llama.cpp permutes llama's q/k rows
            return _unpermute(x, h) if h else x

        grouped = decode(t.tensor_type.name, t.data, shape) if len(shape) == 2 and name.endswith(".weight") else None
        if grouped is not None:
            stem = name.removesuffix(".weight")
            state[f"{stem}.gq"], state[f"{stem}.gs"] = fix(grouped.q), fix(grouped.scales)
            if grouped.zeros is not None:
                state[f"{stem}.gz"] = fix(grouped.zeros)
            continue
        values = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)  # a writable copy
        if arch == "gemma3" and "norm.weight" in name:
            values = values - 1  # llama.cpp stores Gemma's norms as 1 + w; transformers loads w (the same float32 op)
        state[name] = fix(torch.from_numpy(values))
    return state


def convert_gguf_grouped(gguf_path: Path, out: Path) -> Path:
    """Write `out`: the tensors above, config.json (marked gguf_grouped), the tokenizer. Seconds: nothing is dequantized
    but the small tensors."""
    with shared_gguf_readers():
        return _convert_gguf_grouped(gguf_path, out)


def _convert_gguf_grouped(gguf_path: Path, out: Path) -> Path:
    print(f"reading {gguf_path.name}'s blocks as they are (one time, seconds) ...", flush=True)
    arch = read_header(gguf_path).architecture
    config = gguf_config(gguf_path)
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    state = read_gguf_grouped(gguf_path, arch, config.num_attention_heads, kv_heads)
    if "lm_head.weight" not in state and "lm_head.gq" not in state:
        config.tie_word_embeddings = True  # llama.cpp reads the embedding table as the output when `output` is absent
    config.quantization_config = {"quant_method": QUANT_METHOD}
    return write_converted(gguf_path, out, state, config)


def is_gguf_grouped(model_dir: Path) -> bool:
    return quant_method(model_dir) == QUANT_METHOD


def grouped_of(state: dict[str, torch.Tensor], stem: str, pop: bool = True) -> GroupedInt8 | None:
    """The GroupedInt8 `state` holds for `stem` (removed from it with `pop`), or None."""
    if f"{stem}.gq" not in state:
        return None
    take = state.pop if pop else state.get
    return GroupedInt8(take(f"{stem}.gq"), take(f"{stem}.gs").float().contiguous(), take(f"{stem}.gz", None))


def _put(state: dict[str, torch.Tensor], stem: str, g: GroupedInt8) -> None:
    state[f"{stem}.gq"], state[f"{stem}.gs"] = g.q, g.scales
    if g.zeros is not None:
        state[f"{stem}.gz"] = g.zeros


def harmonize(hf: dict[str, torch.Tensor], fused: Iterable[tuple[str, ...]]) -> dict[str, torch.Tensor]:
    """Make the parts of each fused projection (q/k/v, gate/up) concatenable: one group size (a group of 32 repeats
    its scale over two of 16: the same values), terms on all parts or none (a zero term adds +0), and where any part
    is dense (a type not served) every part dense: the exact served values."""
    layers = sorted({k.split(".")[1] for k in hf if k.startswith("layers.")})
    for layer in layers:
        for parts in fused:
            stems = [f"layers.{layer}.{p}" for p in parts]
            groups = [grouped_of(hf, s) for s in stems]
            if all(g is None for g in groups):
                continue
            if any(g is None for g in groups):
                for s, g in zip(stems, groups, strict=True):
                    if g is not None:
                        hf[f"{s}.weight"] = g.dequantized()
                continue
            size = min(g.group for g in groups)
            zeros = any(g.zeros is not None for g in groups)
            for s, g in zip(stems, groups, strict=True):
                scales = g.scales.repeat_interleave(g.group // size, dim=1)
                z = g.zeros if g.zeros is not None or not zeros else torch.zeros(g.q.shape[0], g.q.shape[1] // 32)
                _put(hf, s, GroupedInt8(g.q, scales.contiguous(), z))
    return hf


def dense_state(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every grouped weight as its float32 values (tensor/pipeline parallelism, or a device neither the C kernel nor the
    Triton GEMM runs on: no grouped layer there)."""
    for stem in sorted({k.rsplit(".", 1)[0] for k in hf if k.endswith(".gq")}):
        g = grouped_of(hf, stem)
        assert g is not None
        hf[f"{stem}.weight"] = g.dequantized()
    return hf


def nibble_offset(g: GroupedInt8, bits: int = 4) -> int | None:
    """The offset that puts g's values in 0..2^bits - 1 for the kernel's nibble layout (kernels/cpu/wg8a8.py `pack`: two
    values a byte; with the scale (fp16 where it is the file's d) and term per 32, 4.5-6 bits a weight against the int8
    layout's 8.5-10): with bits 4, 0 for Q4_K and Q4_1 (0..15), 8 for Q4_0 (-8..7); with bits 5 (the 5-bit layout, the
    nibbles and a plane of fifth bits), 0 for Q5_1 and Q5_K, 16 for Q5_0. None where they do not fit (wider types,
    groups of 16: they stay int8). The kernel's sums are the int8 layout's exactly: the same weights, the same bits."""
    if g.group != 32:
        return None
    lo, hi = int(g.q.min()), int(g.q.max())
    top = (1 << bits) - 1
    return next((offset for offset in (0, 1 << (bits - 1)) if lo + offset >= 0 and hi + offset <= top), None)


def swap_in_grouped(model: nn.Module, state: dict[str, torch.Tensor], lib: ctypes.CDLL | None,
                    device: str | None = None) -> None:
    """Before load_state_dict: each linear whose grouped tensors `state` holds (our names) -> a GgufLinear on them, the
    embedding -> a GgufEmbedding, a tied LM head -> a GgufLinear on the embedding's tensors (held once). Without
    `device`, each packed in `lib`'s layout (the CPU's C kernel, or torch; 4-bit values two a byte: `nibble_offset`);
    with one (a GPU: "cuda", "cuda:1"; "cpu" runs the same path under Triton's interpreter), in the Triton GEMM's
    column layout, already on that device (`model.to(device)` leaves plain attributes where they are)."""
    lanes = lanes_of(lib)

    def layout(g: GroupedInt8) -> Grouped:
        if device is not None:
            from kernels.triton.gguf_gemm import columns  # here: importing triton holds ~70 MB a CPU never uses

            return columns(g, device)
        offset = nibble_offset(g)
        if offset is not None:
            return pack(g, lanes, nibbles=True, offset=offset)
        five = nibble_offset(g, bits=5)
        return pack(g, lanes) if five is None else pack(g, lanes, nibbles=True, offset=five, fifth=True)

    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            stem = f"{name}.{child_name}" if name else child_name
            g = grouped_of(state, stem)
            if g is None:
                continue
            if isinstance(child, nn.Embedding):
                setattr(module, child_name, GgufEmbedding(layout(g)))
            else:
                assert isinstance(child, nn.Linear) and child.bias is None, f"{stem}: a grouped weight with a bias"
                setattr(module, child_name, GgufLinear(layout(g), lib if device is None else None))  # type: ignore[arg-type]
    embed, head = getattr(model, "embed_tokens", None), getattr(model, "lm_head", None)
    if isinstance(embed, GgufEmbedding) and isinstance(head, nn.Linear) and model.config.tie_word_embeddings:
        model.lm_head = GgufLinear(embed.weight_q, lib if device is None else None)
