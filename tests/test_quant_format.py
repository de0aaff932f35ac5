"""The AutoAWQ "GEMM" layout: our packer against a per-element reading of the format, quantization math,
the config.json contract, and a saved checkpoint read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, LlamaConfig

from backend.quant.awq_format import QuantizedWeight, dequantize, fake_quantize, pack, quantize, save_checkpoint, unpack
from backend.quant.config import AwqConfig, GptqConfig, awq_config_of, gptq_config_of, pick_group_size


def nibble(word: int, column: int) -> int:
    """The format, element by element: column j (0..7) of a word sits in nibble j // 2 + 4 * (j % 2)."""
    j = column % 8
    return (word >> (4 * (j // 2 + 4 * (j % 2)))) & 0xF


def reference_pack(values: list[list[int]]) -> list[list[int]]:
    """(rows, cols) ints 0..15 -> (rows, cols / 8) int32 words, written out per element."""
    rows = []
    for row in values:
        words = []
        for c in range(0, len(row), 8):
            word = 0
            for j in range(8):
                word |= row[c + j] << (4 * (j // 2 + 4 * (j % 2)))
            words.append(word - 2**32 if word >= 2**31 else word)  # int32 two's complement
        rows.append(words)
    return rows


def random_quantized(out_f: int, in_f: int, group: int, seed: int = 0) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_f, in_f), generator=g, dtype=torch.uint8)
    zeros = torch.randint(0, 16, (out_f, in_f // group), generator=g, dtype=torch.uint8)
    scales = (torch.rand(out_f, in_f // group, generator=g) * 0.01 + 1e-3).half()
    return QuantizedWeight(q, zeros, scales)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_pack_matches_per_element_reference(group: int) -> None:
    qw = random_quantized(24, 256, group)
    packed = pack(qw)
    assert packed["qweight"].shape == (256, 3) and packed["qweight"].dtype == torch.int32
    assert packed["qzeros"].shape == (256 // group, 3) and packed["qzeros"].dtype == torch.int32
    assert packed["scales"].shape == (256 // group, 24) and packed["scales"].dtype == torch.float16
    assert packed["qweight"].tolist() == reference_pack(qw.q.T.tolist())
    assert packed["qzeros"].tolist() == reference_pack(qw.zeros.T.tolist())
    words = packed["qweight"].tolist()
    assert all(nibble(words[k][n // 8], n) == qw.q[n, k] for k in (0, 7, 255) for n in range(24))
    assert torch.equal(packed["scales"], qw.scales.T)


def test_unpack_inverts_pack() -> None:
    qw = random_quantized(40, 128, 32, seed=3)
    back = unpack(**pack(qw))
    assert torch.equal(back.q, qw.q) and torch.equal(back.zeros, qw.zeros) and torch.equal(back.scales, qw.scales)


def test_known_word() -> None:
    """Columns 0..7 holding the values 0..7 pack to the nibbles 0,2,4,6,1,3,5,7 (low to high): 0x75316420."""
    qw = QuantizedWeight(torch.arange(8, dtype=torch.uint8)[:, None].expand(8, 32).contiguous(),
                         torch.zeros(8, 1, dtype=torch.uint8), torch.ones(8, 1).half())
    assert pack(qw)["qweight"][0, 0].item() == 0x75316420


@pytest.mark.parametrize("group", [32, 64, 128])
def test_quantize_is_within_half_a_step(group: int) -> None:
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(1)) * 0.05
    qw = quantize(w, group)
    assert int(qw.q.max()) <= 15 and int(qw.zeros.max()) <= 15
    step = qw.scales.float().repeat_interleave(group, dim=1)
    assert ((dequantize(qw) - w).abs() <= step / 2 + 1e-6).all()
    assert torch.equal(fake_quantize(w, group), dequantize(qw))


def test_clipping_bounds_the_range() -> None:
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(2))
    max_abs = w.abs().view(8, 1, 64).amax(-1) * 0.5
    deq = dequantize(quantize(w, 64, max_abs))
    step = quantize(w, 64, max_abs).scales.float()
    assert (deq.abs() <= max_abs + step / 2 + 1e-6).all()
    assert torch.equal(fake_quantize(w, 64, max_abs), deq)


def test_config_contract() -> None:
    cfg = LlamaConfig(quantization_config=AwqConfig(group_size=64).to_json())
    assert awq_config_of(cfg) == AwqConfig(group_size=64)
    assert awq_config_of(LlamaConfig()) is None
    autoawq_style = {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"}
    assert awq_config_of(LlamaConfig(quantization_config=autoawq_style)) == AwqConfig(group_size=128)
    for bad in ({"quant_method": "fp8"}, {**AwqConfig().to_json(), "version": "gemv"},
                {**AwqConfig().to_json(), "bits": 8}, {**AwqConfig().to_json(), "group_size": 16}):
        with pytest.raises(ValueError):
            awq_config_of(LlamaConfig(quantization_config=bad))
    gptq = LlamaConfig(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True})
    assert awq_config_of(gptq) is None and gptq_config_of(gptq) == GptqConfig(128, desc_act=True)
    with pytest.raises(ValueError, match="unsupported GPTQ"):  # GPTQ details: tests/test_quant_gptq.py
        gptq_config_of(LlamaConfig(quantization_config={"quant_method": "gptq", "bits": 4}))


def test_group_size_fallback() -> None:
    assert pick_group_size([576, 1536], 128) == 64  # SmolLM2-135M
    assert pick_group_size([576, 1536], 32) == 32
    assert pick_group_size([1024, 2816], 128) == 128
    with pytest.raises(ValueError):
        pick_group_size([100], 128)


def test_saved_checkpoint_reads_back(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text("{}")
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4)
    tensors = {f"model.layers.0.self_attn.q_proj.{k}": v for k, v in pack(random_quantized(64, 64, 32)).items()}
    tensors["model.norm.weight"] = torch.ones(64)
    out = save_checkpoint(tmp_path / "out", tensors, config, AwqConfig(group_size=32), source_dir=src)
    assert (out / "tokenizer.json").exists() and not (tmp_path / "out.partial").exists()
    stored = json.loads((out / "config.json").read_text())["quantization_config"]
    assert stored == {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm",
                      "modules_to_not_convert": None}
    assert awq_config_of(AutoConfig.from_pretrained(out)) == AwqConfig(group_size=32)
    from safetensors.torch import load_file

    loaded = load_file(str(out / "model.safetensors"))
    assert loaded["model.norm.weight"].dtype == torch.float16
    assert torch.equal(loaded["model.layers.0.self_attn.q_proj.qweight"], tensors["model.layers.0.self_attn.q_proj.qweight"])


def test_engine_serves_the_gguf_blocks_of_the_default_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from backend.config import EngineConfig, engine_config_from_env

    monkeypatch.setenv("SMOLGATE_CACHE", str(tmp_path))
    assert EngineConfig().resolved_model() == tmp_path / "models" / "gguf" / "SmolLM2-135M-Instruct"
    awq = EngineConfig(quantization="awq").resolved_model()
    assert awq == tmp_path / "models" / "awq" / "SmolLM2-135M-Instruct"
    fp = engine_config_from_env(environ={"SMOLGATE_QUANTIZATION": "none"})
    assert fp.resolved_model() == tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert EngineConfig(model="/m/x", quantization="none").resolved_model() == Path("/m/x")  # explicit: as is
    with pytest.raises(ValueError):
        EngineConfig(quantization="int3").resolved_model()
