"""Our model equals HF transformers on small random checkpoints of each supported family (Llama's, Qwen3, Gemma 3).

No weights are downloaded: each test builds a tiny randomly initialised HF model, saves it as an HF
safetensors directory, loads it with our loader, and compares logits and greedy decoding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Phi3Config, Qwen2Config, Qwen3Config

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from tests.engine_helpers import assert_no_leaks, run_to_completion, save_random_model, token_ids

SMALL = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
)
CONFIGS = {
    "llama": LlamaConfig(**SMALL, tie_word_embeddings=True),
    "llama3-rope-scaling": LlamaConfig(
        **SMALL,
        rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
        },
    ),
    "qwen2": Qwen2Config(**SMALL, tie_word_embeddings=False),  # q/k/v carry biases
    "mistral": MistralConfig(**SMALL, sliding_window=None, head_dim=16),
    "qwen3": Qwen3Config(**SMALL, head_dim=16, tie_word_embeddings=False),  # QK-norm
    # sliding (window 8, rope base 10k) and full (rope base 1M) layers, QK-norm, sandwich norms, GeGLU, scaled embeddings
    "gemma3": Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 3}, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    ),
    # q/k/v and gate/up fused in the checkpoint itself; Phi-4-mini's partial rotary (12 of 16 dims turn) and tied head
    "phi3": Phi3Config(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2),
    "phi4-mini-partial-rotary": Phi3Config(**SMALL, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                           partial_rotary_factor=0.75, tie_word_embeddings=True,
                                           initializer_range=0.2),  # peaked attention: positions matter
}
NORM_STD = {"qwen3": 0.3, "gemma3": 0.3}  # random norm weights: how a family applies them must match


@pytest.mark.parametrize("family", list(CONFIGS))
def test_family_matches_hf(family: str, tmp_path: Path) -> None:
    hf = save_random_model(CONFIGS[family], tmp_path, NORM_STD.get(family, 0.0))
    engine = LLMEngine(EngineConfig(model=str(tmp_path), max_num_batched_tokens=7, kv_cache_memory_mb=4))
    prompts = [[(i * 37 + j * 11) % 500 + 2 for j in range(n)] for i, n in enumerate((5, 19, 40))]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=[], pad_token_id=0)
            assert token_ids(outs[f"r{i}"]) == ref[0, len(prompt) :].tolist(), f"{family}: prompt {i} diverged"
        # and the log-probabilities themselves (greedy tokens of a random model can hide a wrong rotary)
        scored = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
        got = run_to_completion(engine, {0: [("lp", prompts[2], scored)]})["lp"][0].prompt_logprobs
        ref_lp = torch.log_softmax(hf(torch.tensor([prompts[2]])).logits[0].float(), dim=-1)
        want = [ref_lp[j - 1, t].item() for j, t in enumerate(prompts[2]) if j]
        assert max(abs(g.logprob - w) for g, w in zip(got[1:], want, strict=True)) < 1e-3, family
    assert_no_leaks(engine)


def test_gemma3_prefix_cache_and_preemption_keep_hf_greedy(tmp_path: Path) -> None:
    """Gemma 3 through a shared prefix (prefix-cache hits), chunked prefill past the sliding window, and a KV budget
    too small for every sequence at once (preemption and recompute): still HF's greedy tokens."""
    hf = save_random_model(CONFIGS["gemma3"], tmp_path, NORM_STD["gemma3"])
    # 3 layers x K,V x 2 heads x 16 x 4 bytes = 768 bytes a token: 1 MiB holds 85 blocks of 16, the batch ~100
    engine = LLMEngine(EngineConfig(model=str(tmp_path), max_num_batched_tokens=64, kv_cache_memory_mb=1))
    shared = [(j * 13) % 500 + 2 for j in range(48)]
    prompts = [shared + [(i * 29 + j * 7) % 500 + 2 for j in range(120 + 6 * i)] for i in range(8)]
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    assert engine.kv.hits > 0, "the shared prefix should hit the prefix cache"
    assert engine.scheduler.num_preemptions > 0, "the KV budget should force preemption"
    with torch.inference_mode():
        for i, prompt in enumerate(prompts):
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False, eos_token_id=[], pad_token_id=0)
            assert token_ids(outs[f"r{i}"]) == ref[0, len(prompt) :].tolist(), f"prompt {i} diverged"
    assert_no_leaks(engine)


def test_longrope_serves_up_to_its_original_context() -> None:
    """Phi-3/4's longrope switches every position's angles past original_max_position_embeddings; the context stops
    there (backend/model/arch.py: context_limit), and a plain config keeps its own."""
    from backend.model.arch import context_limit

    head = SMALL["hidden_size"] // SMALL["num_attention_heads"]
    longrope = Phi3Config(**{**SMALL, "max_position_embeddings": 1024}, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                          original_max_position_embeddings=256, rope_parameters={
                              "rope_type": "longrope", "short_factor": [1.0] * (head // 2), "long_factor": [4.0] * (head // 2),
                              "original_max_position_embeddings": 256})
    assert context_limit(longrope) == 256
    assert context_limit(CONFIGS["phi3"]) == SMALL["max_position_embeddings"]
