"""Weight-only INT8 (per-channel scales): the layer against its own dequantized weight, and a tiny random Llama
served with `quantization: int8` against HF transformers' forward with the same rounded weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.quant.int8_linear import DENSE_ROWS, Int8Linear, quantize_int8
from backend.quant.lm_head import LowBitHead
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model

CONFIG = LlamaConfig(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
)
PROMPT = [(7 * j) % 500 + 2 for j in range(40)]


def test_quantize_int8_error_is_half_a_step() -> None:
    w = torch.randn(96, 80)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert ((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("rows", [1, 3, DENSE_ROWS, 70], ids=["decode", "few", "dense-threshold", "prefill"])
def test_int8_linear_matches_its_dequantized_weight(rows: int) -> None:
    torch.manual_seed(0)
    lin = nn.Linear(96, 160, bias=True)
    layer = Int8Linear(lin.weight, lin.bias)
    x = torch.randn(rows, 96)
    ref = F.linear(x.bfloat16().float(), layer.dequantized(), lin.bias)
    out = layer(x)
    assert out.dtype == x.dtype and out.shape == (rows, 160)
    torch.testing.assert_close(out, ref, atol=0.03, rtol=0.02)
    assert layer.weight_bytes() == 96 * 160 + 160 * 2


@torch.no_grad()
def test_engine_int8_matches_hf_with_rounded_weights(tmp_path: Path) -> None:
    hf = save_random_model(CONFIG, tmp_path)
    engine = LLMEngine(EngineConfig(model=str(tmp_path), quantization="int8", kv_cache_memory_mb=4))
    model = engine.runner.model
    assert isinstance(model.layers[0].mlp.down_proj, Int8Linear) and isinstance(model.lm_head, LowBitHead)
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    lps = run_to_completion(engine, {0: [("lp", PROMPT, params)]})["lp"][0].prompt_logprobs
    got = [t.logprob for t in lps[1:]]
    # Reference: HF's forward with each projection set to its int8 * scale weight, the head at bf16 (its 40-row path).
    for layer in hf.model.layers:
        for lin in (*(getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")),
                    *(getattr(layer.mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))):
            q, scale = quantize_int8(lin.weight)
            lin.weight.data = (q.float() * scale[:, None]).bfloat16().float()
    hf.lm_head.weight = nn.Parameter(hf.model.embed_tokens.weight.data.bfloat16().float())
    logits = hf(torch.tensor([PROMPT])).logits[0].float().log_softmax(-1)
    want = [logits[i, PROMPT[i + 1]].item() for i in range(len(PROMPT) - 1)]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=0.05, rtol=0)
    assert_no_leaks(engine)


def test_unknown_quantization_is_refused() -> None:
    with pytest.raises(ValueError, match="int8"):
        EngineConfig(quantization="fp4").resolved_model()
