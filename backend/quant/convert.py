"""Turn our LlamaForCausalLM into its INT4 form for an AWQ checkpoint or a GGUF's blocks: the loader's hooks.

    swap_in_int4(model, awq)   on the meta device, before load_state_dict: every projection -> Int4Linear
    swap_in_gguf_blocks(model, state)   the same for a GGUF's Q4_0/Q4_1 blocks, projection by projection
    prepare_int4(model)        after loading and moving to the device: repack, plus a low-bit lm_head copy
    quantize_int8(model)       a full-precision model after loading (quantization: int8): projections ->
                               Int8Linear (per-channel int8), plus the same lm_head copy

The lm_head (49152 x 576 for SmolLM2, tied to the embedding table) is a quarter of the weights a decode step
reads, so INT4 projections alone would cap the speedup near 1.6x. AWQ checkpoints keep it in fp16 (that is
the format), so the engine makes a low-bit serving copy at load time (lm_head.py: int8 rows for decode,
bf16 for batches); the full-precision embedding table stays for the token lookup.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from backend.config import cache_dir
from backend.quant.config import AwqConfig
from backend.quant.cpu_gemm import dense_dtype
from backend.quant.gguf_blocks import BLOCK
from backend.quant.int4_linear import Int4Linear
from backend.quant.int8_linear import Int8Linear
from backend.quant.lm_head import LowBitHead
from kernels.cpu.build import c_gemms_unavailable
from kernels.cpu.w4a8 import load_w4a8
from kernels.cpu.w8a8 import load_w8a8

PROJECTIONS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


def swap_in_int4(model: nn.Module, awq: AwqConfig) -> None:
    """Replace each decoder layer's projections (nn.Linear) by an empty Int4Linear of the same shape."""
    for layer in model.layers:
        for path in PROJECTIONS:
            parent_name, name = path.split(".")
            parent = getattr(layer, parent_name)
            linear: nn.Linear = getattr(parent, name)
            int4 = Int4Linear(linear.in_features, linear.out_features, awq.group_size, linear.bias is not None)
            setattr(parent, name, int4)


def swap_in_gguf_blocks(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """On the meta device, before load_state_dict: each projection whose GGUF blocks `state` holds (our names, after
    fusion) -> an empty Int4Linear in the gguf layout; the others stay nn.Linear (their tensors were dequantized)."""
    for i, layer in enumerate(model.layers):
        for path in PROJECTIONS:
            if f"layers.{i}.{path}.q4" not in state:
                continue
            parent_name, name = path.split(".")
            parent = getattr(layer, parent_name)
            linear: nn.Linear = getattr(parent, name)
            int4 = Int4Linear(linear.in_features, linear.out_features, BLOCK, linear.bias is not None, layout="gguf")
            setattr(parent, name, int4)


def prepare_int4(
    model: nn.Module, quantize_lm_head: bool = True, dense_copy: bool = True, cpu_kernel: str = "auto",
    *, deterministic: bool = False,
) -> None:
    """Repack every Int4Linear for its device (`dense_copy`: plus a dense copy for batched calls on CPU when
    torch's int4 kernel serves them; `cpu_kernel`, `deterministic`: see EngineConfig.int4_cpu_kernel and
    w4a8_kernel); give the lm_head a low-bit copy (embeddings untouched): with the C kernels, int8 rows served by
    the W8A8 kernel."""
    lib = w4a8_kernel(cpu_kernel, deterministic) if next(model.parameters()).device.type == "cpu" else None
    for module in model.modules():
        if isinstance(module, Int4Linear):
            module.prepare(dense_copy, lib)
    head = model.lm_head
    if quantize_lm_head and isinstance(head, nn.Linear):
        head_lib = load_w8a8(cache_dir() / "kernels") if lib is not None else None  # the C kernels build together
        model.lm_head = LowBitHead(head.weight, head.bias, head_lib)


def w4a8_kernel(choice: str, deterministic: bool = False) -> ctypes.CDLL | None:
    """The W4A8 CPU kernel for `choice` auto | w4a8 (required) | torch (never). auto: where it builds, if
    `deterministic` (EngineConfig.deterministic: its result for a row is the same at any row count, while torch's
    int4 kernel for few rows and the dense copy for many round differently: docs/determinism.md); otherwise only
    where the CPU has no native bf16 (AVX2-only: measured there, bench/README "C kernels"), a CPU with AVX-512 BF16
    / AMX keeping torch's int4 kernel + the bf16 dense copy (faster prefill there)."""
    if choice not in {"auto", "w4a8", "torch"}:
        raise ValueError(f"unknown int4_cpu_kernel {choice!r}: use auto, w4a8 or torch")
    if choice == "torch" or (choice == "auto" and not deterministic and dense_dtype("cpu") == torch.bfloat16):
        return None
    lib = load_w4a8(cache_dir() / "kernels")
    if lib is None and choice == "w4a8":
        why = c_gemms_unavailable() or f"the build failed (log: {cache_dir() / 'kernels' / 'w4a8.log'})"
        raise ValueError(f"int4_cpu_kernel w4a8: {why}")
    return lib


def int4_weight_bytes(model: nn.Module) -> int:
    """Bytes held by the INT4 projections as prepared."""
    return sum(m.weight_bytes() for m in model.modules() if isinstance(m, Int4Linear))


def quantize_int8(model: nn.Module, deterministic: bool = False) -> None:
    """INT8 at load time: every projection's weight -> int8 with one scale per output channel. `deterministic`
    (EngineConfig.deterministic): on a CPU where the C kernels build, the projections and the lm_head run on the
    W8A8 kernel (the same int8 weights, activations quantized per row and group; a row's result does not depend on
    the row count), else torch's int8 kernel for few rows and a dense GEMM for many (weight-only, batch-dependent)."""
    on_cpu = next(model.parameters()).device.type == "cpu"
    lib = load_w8a8(cache_dir() / "kernels") if deterministic and on_cpu else None
    for layer in model.layers:
        for path in PROJECTIONS:
            parent_name, name = path.split(".")
            parent = getattr(layer, parent_name)
            linear: nn.Linear = getattr(parent, name)
            setattr(parent, name, Int8Linear(linear.weight, linear.bias, lib))
    head = model.lm_head
    if isinstance(head, nn.Linear):
        model.lm_head = LowBitHead(head.weight, head.bias, lib)
