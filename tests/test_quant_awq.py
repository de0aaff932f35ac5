"""AWQ on real SmolLM2-135M layers (small calibration from the shipped text): the folding keeps the float
function, and the quantized block's output error is lower than plain round-to-nearest's."""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch
from torch import nn

from backend.config import default_model_path
from backend.quant.awq import layer_inputs, load_hf_model
from backend.quant.awq_format import fake_quantize
from backend.quant.awq_search import LINEARS, awq_layer, expand
from backend.quant.calibration import HELDOUT, calibration_batch

GROUP = 64
pytestmark = pytest.mark.skipif(not default_model_path().exists(), reason="run `python -m backend.fetch` first")


@cache
def model() -> nn.Module:
    torch.set_flush_denormal(True)
    return load_hf_model(default_model_path())


@torch.no_grad()
def layer_input(index: int, ids: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    hidden, pos_emb = layer_inputs(model(), ids)
    for layer in model().model.layers[:index]:
        hidden = layer(hidden, attention_mask=None, position_embeddings=pos_emb)
    return hidden, pos_emb


@torch.no_grad()
def quantized_error(layer: nn.Module, clips: dict[str, torch.Tensor], hidden: torch.Tensor, pos_emb, ref: torch.Tensor) -> float:
    layer = copy.deepcopy(layer)
    for name in LINEARS:
        lin = layer.get_submodule(name)
        lin.weight.data = fake_quantize(lin.weight.data, GROUP, clips.get(name))
    out = layer(hidden, attention_mask=None, position_embeddings=pos_emb)
    return (out - ref).pow(2).mean().item()


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_path())


@pytest.mark.parametrize("index", [1, 6])
def test_awq_beats_rtn_on_block_output(index: int) -> None:
    calib = calibration_batch(tokenizer(), 4, 128)
    hidden, pos_emb = layer_input(index, calib)
    original = model().model.layers[index]
    layer = copy.deepcopy(original)
    with torch.no_grad():
        ref = original(hidden, attention_mask=None, position_embeddings=pos_emb)
    clips, out, alphas = awq_layer(layer, hidden, pos_emb, GROUP, head_dim=model().config.head_dim)
    assert torch.allclose(out, ref)
    with torch.no_grad():  # folded scales: the same float function
        folded = layer(hidden, attention_mask=None, position_embeddings=pos_emb)
    assert (folded - ref).abs().max() <= 1e-3 * ref.abs().max()
    assert any(a > 0 for a in alphas)
    # Judged on held-out text, not the calibration blocks the search saw.
    test_hidden, test_pos = layer_input(index, calibration_batch(tokenizer(), 4, 128, HELDOUT))
    with torch.no_grad():
        test_ref = original(test_hidden, attention_mask=None, position_embeddings=test_pos)
    rtn = quantized_error(original, {}, test_hidden, test_pos, test_ref)
    awq = quantized_error(layer, clips, test_hidden, test_pos, test_ref)
    assert awq < 0.9 * rtn, f"layer {index}: AWQ error {awq:.3e} vs RTN {rtn:.3e}"


def test_gqa_scale_expansion_matches_head_mapping() -> None:
    """q head h reads kv head h // n_rep: o_proj input channel h * d + j takes v channel (h // n_rep) * d + j."""
    kv_heads, n_rep, d = 3, 3, 4
    s = torch.arange(kv_heads * d, dtype=torch.float32)
    e = expand(s, n_rep, d)
    for h in range(kv_heads * n_rep):
        for j in range(d):
            assert e[h * d + j] == s[(h // n_rep) * d + j]
