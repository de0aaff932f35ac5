"""Load a model directory (HF safetensors) or a GGUF file into our LlamaForCausalLM.

HF names map onto ours with two fusions: q/k/v -> qkv_proj and gate/up -> gate_up_proj.
A GGUF file is converted once to safetensors under the cache folder, then loaded the same way: by default
(`quantization: auto`) its Q4_0/Q4_1 blocks as they are (backend/quant/gguf_blocks.py), otherwise dequantized.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, PretrainedConfig

from backend.config import EngineConfig, cache_dir
from backend.model.arch import arch_of, context_limit, preflight
from backend.model.llama import LlamaForCausalLM
from backend.model.ops import CpuOps, Ops
from backend.model.spm_tokenizer import save_spm, written
from backend.quant.config import AWQ_TENSORS, AwqConfig, GptqConfig, awq_config_of, gptq_config_of
from backend.quant.cpu_gemm import add_packed_copies
from backend.quant.gguf_blocks import ARCHITECTURES as BLOCK_ARCHITECTURES
from backend.quant.gguf_blocks import BLOCK_TENSORS, NoBlocksError, as_module_tensors, dequantize_mixed_groups, is_gguf_blocks
from backend.quant.gguf_grouped import ARCHITECTURES as GROUPED_ARCHITECTURES
from backend.quant.gguf_grouped import TENSORS as GROUPED_TENSORS
from backend.quant.gguf_grouped import dense_state, harmonize, is_gguf_grouped
from backend.quant.gguf_header import GgufHeader, read_header
from backend.quant.gguf_types import SERVED
from backend.quant.huge_pages import head_on_huge_pages
from backend.quant.kept_output import keep_head_output

log = logging.getLogger(__name__)
FLOAT_TYPES = ("F32", "F16", "BF16")
FUSED = {  # our parameter -> the HF parameters concatenated along the output dimension
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def resolve_model_dir(path: Path, gguf_blocks: bool = False) -> Path:
    """A GGUF file becomes a converted directory under the cache; a directory is used as is. With `gguf_blocks`
    (`quantization: auto`) its weights keep their own bits: Llama/Qwen2 Q4_0/Q4_1 blocks as INT4 layers
    (gguf_blocks.py), else every served block type as grouped int8 (gguf_grouped.py); without, dequantized."""
    if path.is_dir():
        return path
    header = preflight(path)  # milliseconds: a file we cannot serve stops here, before any conversion
    assert header is not None  # not a directory
    digest = hashlib.sha256(f"{path.resolve()}:{path.stat().st_size}".encode()).hexdigest()[:12]
    if gguf_blocks and header.architecture in BLOCK_ARCHITECTURES and {"Q4_0", "Q4_1"} & set(header.tensor_types):
        from backend.quant.gguf_blocks import convert_gguf_blocks

        blocks = cache_dir() / "converted" / f"{path.stem}-{digest}-blocks"
        try:
            return with_spm(header, blocks if (blocks / "model.safetensors").exists() else convert_gguf_blocks(path, blocks))
        except NoBlocksError:
            pass  # nothing 4-bit to keep (another block type, another architecture): grouped or dequantized below
    if gguf_blocks and header.architecture in GROUPED_ARCHITECTURES and set(SERVED) & set(header.tensor_types):
        from backend.quant.gguf_grouped import convert_gguf_grouped

        grouped = cache_dir() / "converted" / f"{path.stem}-{digest}-grouped"
        return with_spm(header, grouped if (grouped / "model.safetensors").exists() else convert_gguf_grouped(path, grouped))
    out = cache_dir() / "converted" / f"{path.stem}-{digest}"
    if not (out / "model.safetensors").exists():
        from backend.model.gguf_convert import convert_gguf_to_hf

        convert_gguf_to_hf(path, out)
    return with_spm(header, out)


def with_spm(header: GgufHeader, model_dir: Path) -> Path:
    """`model_dir` with the file's SentencePiece proto beside the converted weights (the engine's tokenizer, where
    backend/model/spm_tokenizer.py serves the vocabulary), or the reason it does not, written once, a fraction of a
    second; a folder converted before (or by a version with another SPM_FORMAT) gets it here, without converting
    again."""
    if not written(model_dir):
        save_spm(header, model_dir)
    return model_dir


def serving_quantization(path: Path, model_dir: Path, quantization: str, device: str, *, parallel: bool) -> str:
    """`auto` for a GGUF file that was dequantized (an architecture or block types not served in their own bits): on
    a CPU the projections are re-quantized to INT8 (the W8A8 kernel and an int8 LM head: a quarter of float32's bytes a
    step) with a log line naming the types; on a GPU, or sharded, full precision. Anything else is served as
    configured (a file in its own bits included: gguf_blocks, gguf_grouped)."""
    if quantization != "auto" or path.suffix != ".gguf" or is_gguf_blocks(model_dir):
        return quantization
    types = read_header(path).tensor_types
    if is_gguf_grouped(model_dir):
        own = ", ".join(f"{name} x{n}" for name, n in types.most_common() if name in SERVED)
        rest = ", ".join(f"{name} x{n}" for name, n in types.most_common() if name not in SERVED + FLOAT_TYPES)
        where = "float32 values (no grouped kernel here)"
        if grouped_kernel_runs(device, parallel=parallel):
            where = "grouped int8 kernel" if device == "cpu" else "grouped int8 Triton GEMM"
        log.info("%s: %s served in their own bits (%s)%s", path.name, own, where,
                 f"; {rest} dequantized to float32" if rest else "")
        return quantization
    kept = ", ".join(f"{name} x{n}" for name, n in types.most_common() if name not in FLOAT_TYPES)
    choice = "int8" if device == "cpu" and not parallel else "none"
    log.info("%s: %s not served in their own bits yet: dequantized, projections served as %s (quantization: none keeps "
             "full precision)", path.name, kept or "no quantized tensors", "INT8" if choice == "int8" else "full precision")
    return choice


def grouped_kernel_runs(device: str, *, parallel: bool) -> bool:
    """Whether a gguf_grouped checkpoint's weights stay grouped int8 on `device`: in one process, on a CPU (the C
    kernel, or torch on each call's dequantized weight) or a CUDA GPU (the Triton GEMM); sharded, float32."""
    return not parallel and (device == "cpu" or device.startswith("cuda"))


def load_config(model_dir: Path) -> PretrainedConfig:
    config = AutoConfig.from_pretrained(model_dir)
    arch_of(config)  # an unsupported architecture stops here, by name, before any weight is read
    return config


def model_max_len(model_dir: Path) -> int:
    """The longest context the checkpoint supports (sliding windows are attended exactly: backend/model/sliding_window.py)."""
    return context_limit(load_config(model_dir))


def read_hf_tensors(model_dir: Path, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """Tensors by name without the "model." prefix; `keep` picks which (a pipeline stage reads only its own)."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                short = name.removeprefix("model.")
                if keep is None or keep(short):
                    tensors[short] = f.get_tensor(name)
    if not tensors:
        raise FileNotFoundError(f"no .safetensors files in {model_dir}")
    return tensors


def to_our_names(hf: dict[str, torch.Tensor], layer_ids: range) -> dict[str, torch.Tensor]:
    """Rename HF tensors to our module names, concatenating the fused projections. Layer layer_ids[j] becomes
    our layers.j (a pipeline stage numbers its layers from 0)."""
    ours = {k: v for k, v in hf.items() if not k.startswith("layers.")}
    for j, i in enumerate(layer_ids):
        prefix = f"layers.{i}."
        layer = {k.removeprefix(prefix): v for k, v in hf.items() if k.startswith(prefix)}
        for fused, parts in FUSED.items():
            # AWQ tensors are (in, out): fuse along dim 1
            for kind in ("weight", "bias", *AWQ_TENSORS, *BLOCK_TENSORS, *GROUPED_TENSORS):
                if f"{parts[0]}.{kind}" in layer:
                    dim = 1 if kind in AWQ_TENSORS else 0
                    layer[f"{fused}.{kind}"] = torch.cat([layer.pop(f"{p}.{kind}") for p in parts], dim=dim)
            if f"{parts[0]}.in_perm" in layer:  # act-order GPTQ: the fused parts share one input, so one order
                perms = [layer.pop(f"{p}.in_perm") for p in parts]
                if not all(p.equal(perms[0]) for p in perms):
                    raise ValueError(f"layer {i}: act-order GPTQ with different channel orders in {parts} cannot be fused")
                layer[f"{fused}.in_perm"] = perms[0]
        ours.update({f"layers.{j}.{k}": v for k, v in layer.items()})
    return ours


def _empty_model(
    config: PretrainedConfig, max_positions: int, ops: Ops | None, awq: AwqConfig | None, *, quantization: str,
    tp: tuple[int, int] | None, pp: tuple[int, int] | None,
) -> LlamaForCausalLM:
    """The model (or this rank's part of it) on the meta device, INT4 layers swapped in for AWQ/GPTQ."""
    with torch.device("meta"):
        if tp is not None:
            from backend.model.tensor_parallel import shard_config

            if awq is not None or quantization == "int8":
                raise ValueError("tensor parallelism needs full-precision weights (quantization: none)")
            model = LlamaForCausalLM(shard_config(config, tp[1]), max_positions, ops)
        elif pp is not None:
            from backend.model.pipeline_parallel import PipelineStage

            model = PipelineStage(config, max_positions, ops, pp)
        else:
            model = LlamaForCausalLM(config, max_positions, ops)
        if awq is not None:
            from backend.quant.convert import swap_in_int4

            swap_in_int4(model, awq)
    return model


def _read_state(model_dir: Path, model: LlamaForCausalLM, gptq: GptqConfig | None, tp: tuple[int, int] | None,
                *, pp: tuple[int, int] | None, grouped: str | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors this model holds, in our names (a pipeline stage reads only its own). grouped: a
    gguf_grouped checkpoint's weights kept (`kept`) or as float32 (`dense`: no grouped kernel on that path)."""
    keep = None
    if pp is not None:
        from backend.model.pipeline_parallel import keeps_tensor

        ends = model.embed_tokens is not None
        keep = lambda name: keeps_tensor(name, model.layer_ids, ends)  # noqa: E731
    hf = read_hf_tensors(model_dir, keep)
    if any(k.endswith(".q4") for k in hf):  # GGUF blocks: a fused projection's parts must share a form
        hf = as_module_tensors(dequantize_mixed_groups(hf, FUSED.values()))
    if grouped is not None:
        hf = dense_state(hf) if grouped == "dense" else harmonize(hf, FUSED.values())
    if gptq is not None:
        from backend.quant.gptq_format import convert_gptq_tensors

        hf = convert_gptq_tensors(hf, gptq)
    state = to_our_names(hf, model.layer_ids)
    if tp is not None:
        from backend.model.tensor_parallel import shard_state

        state = shard_state(state, model.config, *tp)
    return state


def load_model(
    path: Path, engine: EngineConfig, max_positions: int, ops: Ops | None = None, *, quantization: str | None = None,
    tp: tuple[int, int] | None = None, pp: tuple[int, int] | None = None,
) -> LlamaForCausalLM:
    """The model at `path` as `engine` (EngineConfig, passed whole) says to load it: its dtype and device, the INT4
    layers' options (int4_dense_copy, int4_cpu_kernel), packed_copy (full-precision linears on CPU also keep a
    oneDNN-prepacked copy for multi-row calls: backend/quant/cpu_gemm.py) and deterministic (the linears on kernels
    whose result for a row does not depend on the row count). quantization: the resolved one (`serving_quantization`;
    default engine.quantization): "int8" quantizes a full-precision checkpoint's projections at load time; a quantized
    checkpoint (AWQ, GPTQ, GGUF blocks) always loads as it says. tp = (rank, world): this rank's tensor-parallel shard
    (backend/model/tensor_parallel.py); pp = (rank, world): this rank's pipeline stage
    (backend/model/pipeline_parallel.py)."""
    dtype, device = getattr(torch, engine.dtype), engine.resolved_device()  # float32 | bfloat16 | float16
    quantization = engine.quantization if quantization is None else quantization
    model_dir = resolve_model_dir(path)
    config = load_config(model_dir)
    awq = awq_config_of(config)  # an AWQ checkpoint swaps in INT4 layers (backend/quant)
    gptq = gptq_config_of(config)  # GPTQ is converted to the same INT4 layout at load time
    if gptq is not None:
        awq = AwqConfig(group_size=gptq.group_size)
    blocks = is_gguf_blocks(model_dir)  # a GGUF's Q4_0/Q4_1 blocks: INT4 layers where the state holds them
    # a GGUF's blocks as grouped int8 (gguf_grouped.py) in one process: the C kernel on a CPU, the Triton GEMM on a GPU;
    # with tensor/pipeline parallelism (no sharded grouped layer) or on another device their values as float32
    grouped = None
    if is_gguf_grouped(model_dir):
        grouped = "kept" if grouped_kernel_runs(device, parallel=tp is not None or pp is not None) else "dense"
    if blocks and tp is not None:
        raise ValueError("tensor parallelism needs full-precision weights (quantization: none)")
    if (tp is not None or pp is not None) and not arch_of(config).is_llama:
        raise ValueError(f"tensor and pipeline parallelism take Llama-family blocks, not {config.model_type}")
    model = _empty_model(config, max_positions, ops, awq, quantization=quantization, tp=tp, pp=pp)
    state = _read_state(model_dir, model, gptq, tp, pp=pp, grouped=grouped)
    if grouped == "kept":
        from backend.quant.gguf_grouped import swap_in_grouped
        from kernels.cpu.wg8a8 import load_wg8a8

        if device == "cpu":
            swap_in_grouped(model, state, load_wg8a8(cache_dir() / "kernels"))
        else:  # q, scales and terms go to the GPU now, in the Triton GEMM's layout (kernels/triton/gguf_gemm.py)
            swap_in_grouped(model, state, None, device=device)
    if blocks:
        from backend.quant.convert import swap_in_gguf_blocks

        swap_in_gguf_blocks(model, state)
    for name in [k for k in state if k.endswith(".in_perm")]:  # act-order: Int4Linear gathers its input columns
        model.get_submodule(name.removesuffix(".in_perm")).register_buffer("in_perm", state.pop(name))
    # a later pipeline stage has neither; a grouped embedding's head already shares its tensors (swap_in_grouped)
    tied = config.tie_word_embeddings and isinstance(model.embed_tokens, torch.nn.Embedding)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    unexpected = model.load_state_dict(state, strict=False, assign=True).unexpected_keys
    if tied:
        model.lm_head.weight = model.embed_tokens.weight
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if model.arch.norm_offset:
        fold_norm_offset(model)
    model = model.to(device=device, dtype=dtype).eval()
    if awq is not None or blocks:
        from backend.quant.convert import prepare_int4

        prepare_int4(model, dense_copy=engine.int4_dense_copy, cpu_kernel=engine.int4_cpu_kernel,
                     deterministic=engine.deterministic)
    elif quantization == "int8":
        from backend.quant.convert import quantize_int8

        quantize_int8(model, engine.deterministic)
    elif engine.packed_copy:
        add_packed_copies(model, ops.small_gemm if isinstance(ops, CpuOps) else None, engine.deterministic)
    if tp is not None:
        from backend.model.tensor_parallel import make_row_parallel

        make_row_parallel(model)
    if tp is None and (awq is not None or blocks or grouped == "kept"):  # integer GEMMs: a decode step's layers in
        from backend.model.decode_stack import DecodeStack  # one C call (None without CpuOps, or for blocks it lacks)

        model.decode_stack = DecodeStack.build(model, ops)
    keep_head_output(model)  # the logits tensor kept from step to step (backend/quant/kept_output.py)
    if device == "cpu" and engine.huge_pages:
        head_on_huge_pages(model)  # the head, read whole every step, on 2 MB pages (backend/quant/huge_pages.py)
    model.set_rope(max_positions, device)  # angles stay fp32
    return model


def fold_norm_offset(model: torch.nn.Module) -> None:
    """Gemma's norms apply (1 + w) to the normalised input: add the 1 to every norm's weight once, in the checkpoint's
    precision (fp32 here gives the reference's own (1.0 + w.float())), so the model runs plain RMSNorms."""
    from backend.model.llama import RMSNorm

    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.weight = torch.nn.Parameter(module.weight.data.float() + 1.0, requires_grad=False)
