"""GPTQ checkpoints (4-bit, with and without act-order, formats v1 and v2) load into the engine's INT4 path.

The test writes its own tiny GPTQ checkpoint: a random Llama's projections quantized group-wise, packed with
plain bit arithmetic written here (not the product's packer), g_idx scattered by a random permutation for
act-order. The reference is a straightforward dequantization of those stored tensors (numpy, bit by bit); the
engine must give the same prompt log-probabilities as HF transformers' forward with the reference weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.quant.awq_format import dequantize, unpack
from backend.quant.config import GptqConfig
from backend.quant.gptq_format import awq_to_gptq_checkpoint, to_int4
from backend.quant.int4_linear import Int4Linear
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, write_tokenizer

CONFIG = LlamaConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
)
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
PROMPT = [(7 * j) % 500 + 2 for j in range(40)]
GROUP = 32
CASES = {  # name: (act_order, v1 format, symmetric)
    "plain-v1-sym": (False, True, True),
    "act-order-v1-sym": (True, True, True),
    "act-order-v2-asym": (True, False, False),
}


# ---- the test's own writer and reader of the format ----------------------------------------------------------
def quantize_groups(w: torch.Tensor, g_idx: torch.Tensor, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """GPTQ-style quantization per (output row, group): q (in, out), zeros and scales (groups, out)."""
    out_f, in_f = w.shape
    n_groups = int(g_idx.max()) + 1
    q = np.zeros((in_f, out_f), np.int64)
    zeros, scales = np.zeros((n_groups, out_f), np.int64), np.zeros((n_groups, out_f), np.float16)
    for grp in range(n_groups):
        cols = (g_idx == grp).nonzero().flatten()
        wg = w[:, cols].double()
        if sym:
            scale = (2 * wg.abs().amax(1) / 15).clamp(min=1e-5)
            zero = torch.full((out_f,), 8, dtype=torch.long)
        else:
            lo, hi = wg.amin(1).clamp(max=0), wg.amax(1).clamp(min=0)
            scale = ((hi - lo) / 15).clamp(min=1e-5)
            zero = (-lo / scale.half().double()).round().clamp(0, 15).long()
        scale16 = scale.half()
        qg = (wg / scale16.double()[:, None]).round().long() + zero[:, None]
        q[cols.numpy()] = qg.clamp(0, 15).T.numpy()
        zeros[grp], scales[grp] = zero.numpy(), scale16.numpy()
    return q, zeros, scales


def pack_along(values: np.ndarray, axis: int) -> np.ndarray:
    """8 nibbles per uint32 along `axis` (index 8i + j in bits 4j), returned as int32 bits."""
    v = np.moveaxis(values.astype(np.uint32), axis, 0)
    words = np.zeros((v.shape[0] // 8, *v.shape[1:]), np.uint32)
    for j in range(8):
        words |= (v[j::8] & 0xF) << np.uint32(4 * j)
    return np.ascontiguousarray(np.moveaxis(words, 0, axis)).view(np.int32)


def reference_dequantize(t: dict[str, torch.Tensor], v1: bool) -> torch.Tensor:
    """The stored tensors -> float32 (out, in), one nibble at a time."""
    qweight, qzeros = t["qweight"].numpy().view(np.uint32), t["qzeros"].numpy().view(np.uint32)
    scales, g_idx = t["scales"].float().numpy(), t["g_idx"].numpy()
    in_f, out_f = qweight.shape[0] * 8, qweight.shape[1]
    w = np.zeros((out_f, in_f), np.float32)
    for k in range(in_f):
        q = (qweight[k // 8] >> np.uint32(4 * (k % 8))) & 0xF  # (out,)
        grp = g_idx[k]
        z = (qzeros[grp, np.arange(out_f) // 8] >> (4 * (np.arange(out_f) % 8)).astype(np.uint32)) & 0xF
        z = z.astype(np.int64) + (1 if v1 else 0)
        w[:, k] = (q.astype(np.int64) - z) * scales[grp]
    return torch.from_numpy(w)


def write_gptq_checkpoint(path: Path, act_order: bool, v1: bool, sym: bool) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """A random Llama as a GPTQ checkpoint; returns the HF model and every projection's reference weight."""
    hf = save_random_model(CONFIG, path / "fp")
    gen = torch.Generator().manual_seed(1)
    tensors = {k: v.half() for k, v in hf.state_dict().items() if not k.startswith("lm_head")}
    reference: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(hf.model.layers):
        in_perm = {}
        for name in LINEARS:
            w = layer.get_submodule(name).weight.data
            in_f = w.shape[1]
            if act_order:  # one channel order per input (q/k/v share theirs, as GPTQ's shared Hessian gives)
                perm = in_perm.setdefault(in_f, torch.randperm(in_f, generator=gen))
                g_idx = torch.empty(in_f, dtype=torch.long)
                g_idx[perm] = torch.arange(in_f) // GROUP
            else:
                g_idx = torch.arange(in_f) // GROUP
            q, zeros, scales = quantize_groups(w, g_idx, sym)
            prefix = f"model.layers.{i}.{name}."
            stored = {
                "qweight": torch.from_numpy(pack_along(q, 0)),
                "qzeros": torch.from_numpy(pack_along((zeros - 1) & 0xF if v1 else zeros, 1)),
                "scales": torch.from_numpy(scales),
                "g_idx": g_idx.to(torch.int32),
            }
            del tensors[prefix + "weight"]
            tensors.update({prefix + k: v for k, v in stored.items()})
            reference[prefix + "weight"] = reference_dequantize(stored, v1)
    out = path / "gptq"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    cfg = CONFIG.to_dict()
    cfg["quantization_config"] = GptqConfig(GROUP, act_order, sym, v1).to_json()
    (out / "config.json").write_text(json.dumps(cfg))
    write_tokenizer(out, CONFIG.vocab_size)
    return hf, reference


@torch.no_grad()
def hf_logprobs(hf: nn.Module, weights: dict[str, torch.Tensor]) -> list[float]:
    hf.load_state_dict(weights, strict=False)
    hf.lm_head.weight = nn.Parameter(hf.model.embed_tokens.weight.data.half().bfloat16().float())  # engine's head copy
    hf.model.embed_tokens.weight.data = hf.model.embed_tokens.weight.data.half().float()  # stored fp16
    for norm in [m for m in hf.modules() if "RMSNorm" in type(m).__name__]:
        norm.weight.data = norm.weight.data.half().float()
    logits = hf(torch.tensor([PROMPT])).logits[0].float().log_softmax(-1)
    return [logits[i, PROMPT[i + 1]].item() for i in range(len(PROMPT) - 1)]


@pytest.mark.parametrize("case", CASES)
def test_gptq_layer_conversion_matches_reference(tmp_path: Path, case: str) -> None:
    act_order, v1, sym = CASES[case]
    _, reference = write_gptq_checkpoint(tmp_path, act_order, v1, sym)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "gptq" / "model.safetensors"))
    name = "model.layers.1.mlp.down_proj"
    layer = {k: stored[f"{name}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")}
    t = to_int4(layer, GptqConfig(GROUP, act_order, sym, v1), name)
    w = dequantize(unpack(t["qweight"], t["qzeros"], t["scales"]))  # (out, in) with input channels in in_perm order
    assert ("in_perm" in t) == act_order
    if act_order:
        restored = torch.empty_like(w)
        restored[:, t["in_perm"]] = w
        w = restored
    torch.testing.assert_close(w, reference[f"{name}.weight"], atol=0, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_engine_serves_gptq_like_the_reference(tmp_path: Path, case: str) -> None:
    act_order, v1, sym = CASES[case]
    hf, reference = write_gptq_checkpoint(tmp_path, act_order, v1, sym)
    engine = LLMEngine(EngineConfig(model=str(tmp_path / "gptq"), kv_cache_memory_mb=4))
    layer = engine.runner.model.layers[0].self_attn.qkv_proj
    assert isinstance(layer, Int4Linear) and (layer.in_perm is not None) == act_order
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    lps = run_to_completion(engine, {0: [("lp", PROMPT, params)]})["lp"][0].prompt_logprobs
    got = torch.tensor([t.logprob for t in lps[1:]])
    want = torch.tensor(hf_logprobs(hf, reference))
    torch.testing.assert_close(got, want, atol=0.05, rtol=0)  # bf16 activations through two layers
    assert_no_leaks(engine)


def test_awq_checkpoint_rewritten_as_gptq_gives_the_same_weights(tmp_path: Path) -> None:
    """bench.quant's GPTQ copy of an AWQ checkpoint (v2, asymmetric) holds exactly the AWQ integers."""
    from safetensors.torch import load_file

    from backend.quant.awq import quantize_model

    save_random_model(CONFIG, tmp_path / "fp")
    quantize_model(tmp_path / "fp", tmp_path / "awq", group_size=GROUP, method="rtn", progress=False)
    awq_to_gptq_checkpoint(tmp_path / "awq", tmp_path / "gptq")
    awq, gptq = load_file(str(tmp_path / "awq" / "model.safetensors")), load_file(str(tmp_path / "gptq" / "model.safetensors"))
    name = "model.layers.0.self_attn.o_proj"
    want = dequantize(unpack(awq[f"{name}.qweight"], awq[f"{name}.qzeros"], awq[f"{name}.scales"]))
    got = reference_dequantize({k: gptq[f"{name}.{k}"] for k in ("qweight", "qzeros", "scales", "g_idx")}, v1=False)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_unsupported_gptq_variants_are_refused(tmp_path: Path) -> None:
    write_gptq_checkpoint(tmp_path, False, True, True)
    cfg_path = tmp_path / "gptq" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["quantization_config"]["bits"] = 3
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported GPTQ"):
        LLMEngine(EngineConfig(model=str(tmp_path / "gptq"), kv_cache_memory_mb=4))
