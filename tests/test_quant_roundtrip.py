"""Quantize a tiny random Llama with AWQ, save it in the AutoAWQ layout, load it through the engine.

The reference is HF transformers' model with each projection set to the weight the checkpoint stands for
(dequantized) and the lm_head rounded as the engine's serving copy rounds it: the engine must produce the same prompt
log-probabilities up to bf16 activation rounding. A checkpoint written by an independent packer (the
kernels' AutoAWQ-style reference, separate q/k/v/gate/up tensors, two shards) must load the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.quant.awq import quantize_model
from backend.quant.awq_format import dequantize, unpack
from backend.quant.awq_search import LINEARS
from backend.quant.config import AwqConfig
from backend.quant.int4_linear import Int4Linear
from backend.quant.lm_head import LowBitHead
from kernels.triton.awq_gemm import awq_dequantize, awq_quantize
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

CONFIG = LlamaConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
)
PROMPT = [(7 * j) % 500 + 2 for j in range(40)]
LOGPROB_ATOL = 0.05  # bf16 activations through two layers


def engine_prompt_logprobs(model_dir: Path) -> tuple[LLMEngine, list[float]]:
    engine = LLMEngine(EngineConfig(model=str(model_dir), kv_cache_memory_mb=4))
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = run_to_completion(engine, {0: [("lp", PROMPT, params)]})
    lps = outs["lp"][0].prompt_logprobs
    assert lps is not None and lps[0] is None
    return engine, [t.logprob for t in lps[1:]]


@torch.no_grad()
def reference_logprobs(hf: nn.Module, weights: dict[str, torch.Tensor]) -> list[float]:
    """HF's forward with the given (out, in) projection weights and the engine's lm_head rounding."""
    state = {k: v.float() for k, v in weights.items()}
    hf.load_state_dict(state, strict=False)
    head = hf.model.embed_tokens.weight.data.bfloat16().float()  # the head copy's bf16 path (40 rows at once)
    hf.lm_head.weight = nn.Parameter(head)  # unties: the embedding lookup keeps full precision
    logits = hf(torch.tensor([PROMPT])).logits[0].float().log_softmax(-1)
    return [logits[i, PROMPT[i + 1]].item() for i in range(len(PROMPT) - 1)]


def dequantized_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of our checkpoint, projections as the float (out, in) weights they stand for."""
    raw = {k.removeprefix("model."): v for f in model_dir.glob("*.safetensors") for k, v in load_file(str(f)).items()}
    out = {k: v for k, v in raw.items() if not k.endswith(("qweight", "qzeros", "scales"))}
    for name in [k.removesuffix(".qweight") for k in raw if k.endswith(".qweight")]:
        qw = unpack(raw[f"{name}.qweight"], raw[f"{name}.qzeros"], raw[f"{name}.scales"])
        out[f"{name}.weight"] = dequantize(qw)
    return {("model." + k if not k.startswith("lm_head") else k): v for k, v in out.items()}


@pytest.mark.parametrize("group", [32, 64])
def test_awq_checkpoint_round_trip_through_engine(tmp_path: Path, group: int) -> None:
    src, out = tmp_path / "fp", tmp_path / "awq"
    hf = save_random_model(CONFIG, src)
    calib = torch.randint(2, 512, (4, 64), generator=torch.Generator().manual_seed(0))
    quantize_model(src, out, group_size=group, calibration=calib, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == AwqConfig(group_size=group).to_json()
    assert (out / "tokenizer.json").exists()

    engine, got = engine_prompt_logprobs(out)
    model = engine.runner.model
    assert isinstance(model.layers[0].self_attn.qkv_proj, Int4Linear)
    assert isinstance(model.layers[1].mlp.down_proj, Int4Linear) and isinstance(model.lm_head, LowBitHead)
    assert not isinstance(model.embed_tokens.weight, Int4Linear) and model.embed_tokens.weight.dtype == torch.float32
    ref = reference_logprobs(hf, dequantized_checkpoint(out))
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < LOGPROB_ATOL

    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    outs = run_to_completion(engine, {0: [("g", PROMPT[:9], params)]})
    assert len(token_ids(outs["g"])) == 10
    assert_no_leaks(engine)


def test_awq_keeps_the_float_function_before_rounding(tmp_path: Path) -> None:
    """Folding the scales is exact: the quantized model stays close to the original random model."""
    src, out = tmp_path / "fp", tmp_path / "awq"
    hf = save_random_model(CONFIG, src)
    with torch.no_grad():
        fp = hf(torch.tensor([PROMPT])).logits[0].log_softmax(-1)
    calib = torch.randint(2, 512, (4, 64), generator=torch.Generator().manual_seed(1))
    quantize_model(src, out, group_size=32, calibration=calib, progress=False)
    _, got = engine_prompt_logprobs(out)
    fp_lps = [fp[i, PROMPT[i + 1]].item() for i in range(len(PROMPT) - 1)]
    assert sum(abs(a - b) for a, b in zip(got, fp_lps, strict=True)) / len(got) < 0.1


def test_third_party_autoawq_layout_loads(tmp_path: Path) -> None:
    """Separate q/k/v/gate/up tensors packed by an independent AutoAWQ-style quantizer, split over two shards."""
    src, out = tmp_path / "fp", tmp_path / "third"
    hf = save_random_model(CONFIG, src)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors"))
    state = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    shards: list[dict[str, torch.Tensor]] = [{}, {}]
    dequant: dict[str, torch.Tensor] = {}
    for i in range(CONFIG.num_hidden_layers):
        for name in LINEARS:
            key = f"model.layers.{i}.{name}"
            qweight, qzeros, scales = awq_quantize(state.pop(f"{key}.weight").T, 64)  # (in, out) orientation
            shards[i].update({f"{key}.qweight": qweight, f"{key}.qzeros": qzeros, f"{key}.scales": scales})
            dequant[f"{key}.weight"] = awq_dequantize(qweight, qzeros, scales, 64).T
    shards[0].update({k: v.half() for k, v in state.items()})
    for n, shard in enumerate(shards):
        save_file(shard, str(out / f"model-0000{n + 1}-of-00002.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
    (out / "config.json").write_text(json.dumps(cfg))

    _, got = engine_prompt_logprobs(out)
    ref = reference_logprobs(hf, {**{k: v.half() for k, v in state.items()}, **dequant})
    assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < LOGPROB_ATOL
