"""Phi-3 / Phi-4-mini GGUF files (GGUF architecture `phi3`) through the engine, proven on files llama.cpp's own converter
writes (convert_hf_to_gguf.py, run as it ships) from tiny random-weight Phi3 models.

What holds, and is checked here:
- the header names the architecture, and the config completed from it (backend/quant/gguf_config.py) is the
  checkpoint's: the partial rotary (rope.dimension_count), longrope's short and long factors (two tensors in the file),
  its original context and attention factor; a longrope file is served up to its original context; a rotary wider
  than the heads, or half of longrope's factors, is refused with one line naming the file;
- the float32 copy (`quantization: none`) gives HF transformers' fp32 greedy output token for token, with HF's own
  model class and the checkpoint's own config on the GGUF's weights: Phi-4-mini's form (partial rotary 0.75, longrope,
  tied head; the converter's float32 file, whose weights are the checkpoint's bit for bit; prompt log-probabilities
  within 1e-3 too) and Phi-3's (full rotary; the block-quantized file below, its weights dequantized by gguf-py);
- in its own bits (`quantization: auto`): the converter's Phi-3 file with its fused q/k/v re-encoded as Q4_K, its fused
  gate/up as Q6_K, o_proj Q5_0, down_proj Q4_0, the embedding and the head Q8_0 keeps every projection and the table
  as the file's integers and scales, bit for bit the float32 copy's values, and its greedy output follows that copy's
  (HF's, token for token) but where the activations' int8 rounding per 32 meets a near tie, with the reference's
  tokens' log-probabilities within the bars tests/test_gguf_grouped.py states.

llama.cpp's converter is not a Python package: SMOLGATE_LLAMA_CPP names a llama.cpp source tree (convert_hf_to_gguf.py,
conversion/ and gguf-py/ beside it; llama-cpp-python's sdist carries one in vendor/llama.cpp); without it the tests on
its files skip, saying so. The tokenizer is SmolLM2's (`make test-models`), a GPT-2 BPE the converter knows, as Phi-4-mini's is.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import Phi3Config

from backend.config import EngineConfig, cache_dir
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.model.arch import context_limit
from backend.model.weights import read_hf_tensors, resolve_model_dir
from backend.quant.gguf_config import ROPE_FACTORS, gguf_config
from backend.quant.gguf_grouped import grouped_of, is_gguf_grouped
from backend.quant.gguf_header import read_header
from backend.quant.gguf_linear import GgufEmbedding, GgufLinear
from tests.engine_helpers import (
    assert_no_leaks,
    greedy_reference,
    model_path,
    run_to_completion,
    teacher_forced,
    token_ids,
)

LLAMA_CPP = os.environ.get("SMOLGATE_LLAMA_CPP", "")
requires_converter = pytest.mark.skipif(not (Path(LLAMA_CPP) / "convert_hf_to_gguf.py").is_file(), reason=(
    "SMOLGATE_LLAMA_CPP does not name a llama.cpp source tree with convert_hf_to_gguf.py "
    "(llama-cpp-python's sdist carries one in vendor/llama.cpp)"))

SMALL = dict(vocab_size=49152, hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, pad_token_id=2, bos_token_id=1, eos_token_id=2, initializer_range=0.2)
ROTARY_PAIRS = 24  # Phi-4-mini's form below: 48 of each head's 64 dims turn
SHORT, LONG = [1.0 + 0.13 * i for i in range(ROTARY_PAIRS)], [2.0 + 0.5 * i for i in range(ROTARY_PAIRS)]
CONFIGS = {
    "phi3": Phi3Config(**SMALL, max_position_embeddings=256, original_max_position_embeddings=256),
    # Phi-4-mini's form: partial rotary 0.75, longrope (short factors within the original context), a tied head
    "phi4-mini": Phi3Config(**SMALL, max_position_embeddings=1024, original_max_position_embeddings=256,
                            partial_rotary_factor=0.75, tie_word_embeddings=True, rope_parameters={
                                "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                                "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 256}),
}
# the own-bits file: each weight of the phi3 file in one of the block types Phi-3/4 GGUFs ship
OWN_BITS = {"attn_qkv": "Q4_K", "ffn_up": "Q6_K", "attn_output": "Q5_0", "ffn_down": "Q4_0", "token_embd": "Q8_0",
            "output": "Q8_0"}
TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
NEW = 16
NEAR_TIE = 0.75  # tests/test_gguf_grouped.py's bars
MEAN_DRIFT, P90_DRIFT = 0.15, 0.4


def write_phi3(name: str, root: Path) -> tuple[Path, Path]:
    """A random Phi3 model `name` saved with SmolLM2's tokenizer, and the float32 GGUF llama.cpp's converter writes
    from it."""
    from transformers import AutoModelForCausalLM

    hf_dir = root / name
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(CONFIGS[name]).save_pretrained(hf_dir)
    shutil.copy(model_path() / "tokenizer.json", hf_dir / "tokenizer.json")
    tokenizer_config = json.loads((model_path() / "tokenizer_config.json").read_text())
    # the converter takes phi3's GPT-2 BPE path when the tokenizer says so (else it wants sentencepiece's model)
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "tokenizer_class": "GPT2Tokenizer"}))
    gguf = root / f"test-phi3-gguf-{name}.gguf"
    cmd = [sys.executable, str(Path(LLAMA_CPP) / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f32",
           "--outfile", str(gguf)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(LLAMA_CPP) / "gguf-py")},
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return hf_dir, gguf


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random Q4_K / Q6_K super-blocks (gguf-py has no K-quant encoder): every bit pattern of the quants and sub-scales,
    fp16 scales small enough that the weights are of the model's size and about zero-mean."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    raw = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    d = np.abs(rng.normal(2e-4 if kind == "Q4_K" else 1e-4, 2e-5, size=len(raw))).astype(np.float16)
    if kind == "Q4_K":  # w = d * scale * q - dmin * min: dmin = 7.5 d centres it
        raw[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
        raw[:, 2:4] = (d * 7.5).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:  # Q6_K: w = d * int8 scale * (q - 32)
        raw[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def write_own_bits(source: Path, out: Path) -> Path:
    """`source` (the converter's float32 file) with its projections and table re-encoded as OWN_BITS says: Q4_0, Q5_0
    and Q8_0 by gguf-py's encoder, the K-quants as random blocks; the metadata and every other tensor as they are."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, quantize

    reader = GGUFReader(source)
    writer = GGUFWriter(out, arch="phi3")
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    rng = np.random.default_rng(0)
    for t in reader.tensors:
        part = t.name.split(".")[-2]
        values = np.array(t.data)
        if part not in OWN_BITS:
            writer.add_tensor(t.name, values)
            continue
        qtype = GGMLQuantizationType[OWN_BITS[part]]
        rows, cols = values.shape
        raw = random_blocks(qtype.name, rows, cols, rng) if qtype.name.endswith("_K") else quantize(values, qtype)
        writer.add_tensor(t.name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, Path]]]:
    """name -> (HF directory, GGUF); the engine's converted copies of them are removed from the cache afterwards."""
    root = tmp_path_factory.mktemp("phi3-gguf")
    made = {name: write_phi3(name, root) for name in CONFIGS}
    hf_dir, f32 = made["phi3"]
    made["own-bits"] = (hf_dir, write_own_bits(f32, root / "test-phi3-gguf-own-bits.gguf"))
    yield made
    for _, gguf in made.values():
        for converted in (cache_dir() / "converted").glob(f"{gguf.stem}-*"):
            shutil.rmtree(converted, ignore_errors=True)


def hf_on_gguf_weights(hf_dir: Path, gguf: Path) -> torch.nn.Module:
    """HF's Phi3ForCausalLM with the checkpoint's own config, holding the GGUF's weights (its float32 copy's)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    loaded = hf.load_state_dict(load_file(str(resolve_model_dir(gguf) / "model.safetensors")), strict=False)
    assert not loaded.unexpected_keys and set(loaded.missing_keys) <= {"lm_head.weight"}, loaded  # tied: the table's
    return hf


def test_a_rope_the_model_cannot_take_is_refused_by_name(tmp_path: Path) -> None:
    """A rotary wider than the heads, or one set of longrope factors without the other: one line naming the file."""
    from gguf import GGUFWriter

    from backend.quant.gguf_config import complete_config
    from backend.quant.gguf_header import GgufError

    def header(name: str, dims: int, factors: list[str]) -> Path:
        writer = GGUFWriter(tmp_path / name, arch="phi3")
        writer.add_rope_dimension_count(dims)
        writer.add_uint32("phi3.rope.scaling.original_context_length", 256)
        for factor in factors:
            writer.add_tensor(factor, np.ones(dims // 2, dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return tmp_path / name

    config = CONFIGS["phi3"]
    with pytest.raises(GgufError, match=r"^wide.gguf: phi3 rope.dimension_count 80 does not fit heads of 64 dims$"):
        complete_config(Phi3Config(**config.to_dict()), read_header(header("wide.gguf", 80, [])))
    with pytest.raises(GgufError, match=r"^long.gguf: phi3 longrope needs rope_factors_short and rope_factors_long"):
        complete_config(Phi3Config(**config.to_dict()), read_header(header("long.gguf", 48, ["rope_factors_long.weight"])))
    done = complete_config(Phi3Config(**config.to_dict()), read_header(header("both.gguf", 48, list(ROPE_FACTORS))))
    assert done.rope_parameters["rope_type"] == "longrope" and done.rope_parameters["short_factor"] == [1.0] * 24


@requires_converter
def test_the_config_is_the_checkpoints(files: dict[str, tuple[Path, Path]]) -> None:
    gguf = files["phi4-mini"][1]
    header = read_header(gguf)
    assert header.architecture == "phi3" and header.model_type == "phi3"
    assert header.metadata["phi3.rope.dimension_count"] == 2 * ROTARY_PAIRS
    config = gguf_config(gguf)
    assert config.partial_rotary_factor == 0.75 and config.original_max_position_embeddings == 256
    rope = config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["partial_rotary_factor"] == 0.75
    assert rope["short_factor"] == np.float32(SHORT).tolist() and rope["long_factor"] == np.float32(LONG).tolist()
    assert rope["attention_factor"] == pytest.approx((1 + np.log(4) / np.log(256)) ** 0.5, rel=1e-7)  # llama.cpp's
    assert config.max_position_embeddings == 1024 and context_limit(config) == 256


@requires_converter
def test_phi4_minis_form_equals_hf_token_for_token(files: dict[str, tuple[Path, Path]]) -> None:
    """Partial rotary, longrope, a tied head: the float32 copy against HF, greedy tokens and prompt log-probabilities."""
    hf_dir, gguf = files["phi4-mini"]
    engine = LLMEngine(EngineConfig(model=str(gguf), quantization="none", packed_copy=False, max_num_batched_tokens=7))
    assert engine.max_model_len == 256  # longrope stops at its original context
    assert engine.runner.model.layers[0].self_attn.rotary_dim == 2 * ROTARY_PAIRS
    hf = hf_on_gguf_weights(hf_dir, gguf)
    original = read_hf_tensors(hf_dir)  # the converter's float32 weights are the checkpoint's
    assert all(torch.equal(w, original[k.removeprefix("model.")]) for k, w in hf.state_dict().items() if k != "lm_head.weight")
    prompts = [engine.tokenizer.encode(t) for t in TEXTS]
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    got = run_to_completion(engine, {0: [("lp", prompts[2], scored)]})["lp"][0].prompt_logprobs
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            ref = hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=[], pad_token_id=0)
            assert token_ids(outs[f"r{i}"]) == ref[0, len(p):].tolist(), f"prompt {i} diverged"
        # and the log-probabilities themselves (greedy tokens of a random model can hide a wrong rotary)
        ref_lp = torch.log_softmax(hf(torch.tensor([prompts[2]])).logits[0].float(), dim=-1)
    want = [ref_lp[j - 1, t].item() for j, t in enumerate(prompts[2]) if j]
    assert max(abs(g.logprob - w) for g, w in zip(got[1:], want, strict=True)) < 1e-3
    assert_no_leaks(engine)


@requires_converter
def test_a_conversion_builds_one_gguf_reader(files: dict[str, tuple[Path, Path]], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The tensors come through the header's table and transformers' config and tokenizer share one gguf-py reader
    (backend/quant/gguf_blocks.py's shared_gguf_readers): a conversion into an empty cache builds one GGUFReader."""
    import gguf as gguf_py

    built: list[object] = []

    class Counted(gguf_py.GGUFReader):
        def __init__(self, path: object, mode: str = "r") -> None:
            built.append(path)
            super().__init__(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr(gguf_py, "GGUFReader", Counted)
    monkeypatch.setenv("SMOLGATE_CACHE", str(tmp_path))
    _, gguf = files["own-bits"]
    assert is_gguf_grouped(resolve_model_dir(gguf, gguf_blocks=True))
    assert len(built) == 1 and gguf_py.GGUFReader is Counted


@requires_converter
def test_served_in_its_own_bits(files: dict[str, tuple[Path, Path]]) -> None:
    hf_dir, gguf = files["own-bits"]
    assert read_header(gguf).tensor_types == {"Q4_K": 2, "Q6_K": 2, "Q5_0": 2, "Q4_0": 2, "Q8_0": 2, "F32": 5}
    grouped_dir = resolve_model_dir(gguf, gguf_blocks=True)
    assert is_gguf_grouped(grouped_dir)
    kept, dense = read_hf_tensors(grouped_dir), read_hf_tensors(resolve_model_dir(gguf))
    stems = sorted({k.rsplit(".", 1)[0] for k in kept if k.endswith(".gq")})
    layers = [f"layers.{i}.{p}" for i in range(2) for p in ("mlp.down_proj", "mlp.gate_up_proj", "self_attn.o_proj",
                                                             "self_attn.qkv_proj")]
    assert stems == ["embed_tokens", *layers, "lm_head"]
    for stem in stems:  # the file's values, in our fused layout, bit for bit transformers' dequantized copy
        w = grouped_of(kept, stem)
        assert w is not None and torch.equal(w.dequantized().view(torch.int32), dense[f"{stem}.weight"].view(torch.int32)), stem
    assert all(torch.equal(t, dense[k]) for k, t in kept.items())  # the norms

    reference = LLMEngine(EngineConfig(model=str(gguf), quantization="none", packed_copy=False))
    assert reference.runner.model.arch.rotary_fraction == 1.0
    ref = greedy_reference(reference, TEXTS, NEW)
    prompts, want_all, margins, forced = ref["prompts"], ref["tokens"], ref["margins"], ref["forced"]
    del reference
    hf = hf_on_gguf_weights(hf_dir, gguf)
    with torch.inference_mode():  # the float32 copy of these weights is HF's, token for token
        for p, want in zip(prompts, want_all, strict=True):
            ref = hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=[], pad_token_id=0)
            assert want == ref[0, len(p):].tolist()

    engine = LLMEngine(EngineConfig(model=str(gguf), quantization="auto"))
    model = engine.runner.model
    assert isinstance(model.embed_tokens, GgufEmbedding) and isinstance(model.lm_head, GgufLinear)
    assert len([m for m in model.modules() if isinstance(m, GgufLinear)]) == 2 * 4 + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())  # no float copy of any projection
    greedy = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, greedy) for i, p in enumerate(prompts)]})
    for i, want in enumerate(want_all):
        got = token_ids(outs[f"r{i}"])
        first = next((j for j, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), None)
        margin = margins[i][first] if first is not None else 0.0
        assert margin < NEAR_TIE, f"prompt {i} left the reference at token {first}, where its margin was {margin:.2f}"
    drift = (teacher_forced(engine, prompts, want_all) - forced).abs()
    assert drift.mean().item() < MEAN_DRIFT and drift.quantile(0.9).item() < P90_DRIFT, drift
    assert_no_leaks(engine)
