"""Shared pieces of the engine tests: the real model, prompts, and the HF reference."""

from __future__ import annotations

import os
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import torch

from backend.config import EngineConfig, cache_dir, default_gguf_model_path, default_model_path
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import RequestOutput
from backend.engine.sampling_params import SamplingParams
from backend.model.tokenizer import apply_chat_template

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity in one sentence.",
    "List three fruits.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give me a tip for learning to code.",
    "What colour is the sky on a clear day?",
    "Name a famous painting.",
    "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?",
    "Describe a cat in five words.",
    "Why do leaves change colour in autumn?",
    "Suggest a name for a pet goldfish.",
    "What is photosynthesis?",
    "Tell me a fun fact about octopuses.",
    "What is the largest planet in our solar system?",
    "Write one sentence about friendship.",
    "How do I boil an egg?",
    "Summarise the plot of Cinderella in two sentences.",
    "What does CPU stand for?",
]


def model_path() -> Path:
    return default_model_path()


@cache
def rtn_int4_model() -> Path:
    """The default model in the serving copy's INT4 format (round-to-nearest, group 64), made once per cache.

    `make test` has no AWQ copy (`make test-models` fetches --copies auto,none): tests of the INT4 path (determinism,
    the draft model) use this one. Only the weights' values differ from AWQ's search, not the format or the kernels."""
    from backend.quant.awq import quantize_model

    out = cache_dir() / "test-models" / "SmolLM2-135M-Instruct-rtn-g64"
    if not (out / "model.safetensors").exists():
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        quantize_model(model_path(), tmp, group_size=64, method="rtn", progress=False)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


@cache
def gguf_int4_model() -> Path:
    """The default serving copy: the shipped GGUF's Q4_1 blocks as they are (`make test-models` writes it; written
    here in seconds if missing, from the GGUF kept in the cache)."""
    from backend.fetch import fetch_gguf_blocks

    return fetch_gguf_blocks(default_gguf_model_path())


def make_engine(**overrides: object) -> LLMEngine:
    """The full-precision default model (greedy output is compared with HF's fp32 reference)."""
    return LLMEngine(EngineConfig(**{"quantization": "none", **overrides}))  # type: ignore[arg-type]


@cache
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path())


def chat_ids(question: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return apply_chat_template(tokenizer(), messages)


@cache
def hf_model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.set_flush_denormal(True)  # as the engine does; denormals only cost time, not accuracy here
    return AutoModelForCausalLM.from_pretrained(model_path(), dtype=torch.float32).eval()


@torch.inference_mode()
def hf_greedy(prompt: list[int], max_new_tokens: int, model: torch.nn.Module | None = None) -> list[int]:
    """Reference: greedy decoding with HF transformers' own forward and its KV cache (the default model's, or `model`'s)."""
    out = (model or hf_model()).generate(
        torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[], pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def run_to_completion(engine: LLMEngine, arrivals: dict[int, list[tuple]] | None = None) -> dict[str, list[RequestOutput]]:
    """Step the engine until idle; `arrivals` maps step number -> add_request args to submit then."""
    arrivals = dict(arrivals or {})
    outputs: dict[str, list[RequestOutput]] = {}
    step = 0
    while engine.has_work or arrivals:
        for args in arrivals.pop(step, []):
            engine.add_request(*args)
        for out in engine.step():
            outputs.setdefault(out.request_id, []).append(out)
        step += 1
    return outputs


def teacher_forced(engine: LLMEngine, prompts: list[list[int]], tokens: list[list[int]]) -> torch.Tensor:
    """The log-probability `engine` gives each of `tokens` after its prompt (fed as one prompt: prompt_logprobs)."""
    forced = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    outs = run_to_completion(engine, {0: [(f"t{i}", p + tokens[i], forced) for i, p in enumerate(prompts)]})
    return torch.cat([torch.tensor([lp.logprob for lp in outs[f"t{i}"][0].prompt_logprobs[len(p):]])
                      for i, p in enumerate(prompts)])


def greedy_reference(engine: LLMEngine, texts: list[str], new_tokens: int) -> dict[str, Any]:
    """A reference engine's greedy continuation of each text: prompts, tokens, each token's top-2 logprob margin and
    the teacher-forced log-probabilities of the tokens (what a quantized copy is held against)."""
    prompts = [engine.tokenizer.encode(t) for t in texts]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=2)
    outs = run_to_completion(engine, {0: [(f"r{i}", p, params) for i, p in enumerate(prompts)]})
    tokens = [token_ids(outs[f"r{i}"]) for i in range(len(prompts))]
    margins = [[lp.top[0][2] - lp.top[1][2] for o in outs[f"r{i}"] for d in o.deltas for lp in d.logprobs]
               for i in range(len(prompts))]
    return {"prompts": prompts, "tokens": tokens, "margins": margins, "forced": teacher_forced(engine, prompts, tokens)}


def token_ids(outputs: list[RequestOutput], index: int = 0) -> list[int]:
    return [t for o in outputs for d in o.deltas if d.index == index for t in d.token_ids]


def text(outputs: list[RequestOutput], index: int = 0) -> str:
    return "".join(d.text for o in outputs for d in o.deltas if d.index == index)


def assert_no_leaks(engine: LLMEngine) -> None:
    for pool in (engine.kv.pool, engine.kv.window_pool):
        if pool is not None:
            assert pool.num_free == pool.num_blocks, f"{pool.num_blocks - pool.num_free} KV blocks leaked"
            assert all(b.ref_cnt == 0 for b in pool.blocks)
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting


def check_mixed_speculation(
    engine: LLMEngine, prompts: list[list[int]], reference: list[list[int]], max_new: int, preempts: bool
) -> None:
    """Staggered greedy requests, every other one opting out of speculation: all must equal the reference token
    for token, some drafts accepted and some rejected (rollbacks exercised), no KV block leaked."""
    arrivals = {
        i: [(f"r{i}", p, SamplingParams(temperature=0, max_tokens=max_new, ignore_eos=True, speculate=i % 2 == 0))]
        for i, p in enumerate(prompts)
    }
    outs = run_to_completion(engine, arrivals)
    for i in range(len(prompts)):
        assert token_ids(outs[f"r{i}"]) == reference[i], f"prompt {i} diverged"
    stats = engine.speculator.stats
    assert 0 < stats.accepted < stats.proposed
    if preempts:
        assert engine.scheduler.num_preemptions > 0
    assert_no_leaks(engine)


def save_random_model(config: object, path: Path, norm_std: float = 0.0) -> torch.nn.Module:
    """A random HF model of `config` saved to `path` (+ a synthetic tokenizer). norm_std > 0: the norms' weights are
    drawn too (an initialiser leaves them constant, which would hide how a model applies them: Gemma's 1 + w)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    if norm_std:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.normal_(0.0, norm_std)
    model.save_pretrained(path)
    write_tokenizer(path, config.vocab_size)
    return model


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A word-level tokenizer over a synthetic vocabulary: enough for the engine's detokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w1").save_pretrained(path)


def save_grouped_model(config: object, grouped: Path, dense: Path) -> None:
    """A random HF model of `config` with its projections and embedding table as GGUF-style grouped int8 (what
    backend/quant/gguf_grouped.py writes: <stem>.gq / .gs / .gz, quant_method gguf_grouped) at `grouped`, and the same
    values as float32 weights at `dense`. Attention: groups of 32, no terms (Q8_0's form); MLP: groups of 16 with a term
    per 32 (the K-quants' form); the embedding (tied head): groups of 32 with terms."""
    import json

    from safetensors.torch import load_file, save_file

    from kernels.cpu.wg8a8 import GroupedInt8

    save_random_model(config, dense)
    file = dense / "model.safetensors"
    state = load_file(str(file))
    out: dict[str, torch.Tensor] = {}
    for name, w in state.items():
        stem, kind = name.rsplit(".", 1)
        if kind != "weight" or w.dim() != 2:
            out[name] = w
            continue
        group, terms = (16, True) if ".mlp." in name else (32, ".embed_tokens" in name)
        n, k = w.shape
        z = w.view(n, k // 32, 32).mean(-1) if terms else None
        centred = w - z.repeat_interleave(32, dim=1) if z is not None else w
        s = centred.view(n, k // group, group).abs().amax(-1).clamp(min=1e-8) / 127
        q = (centred / s.repeat_interleave(group, dim=1)).round().clamp(-128, 127).to(torch.int8)
        g = GroupedInt8(q, s.contiguous(), z)
        out[f"{stem}.gq"], out[f"{stem}.gs"] = g.q, g.scales
        if z is not None:
            out[f"{stem}.gz"] = z.contiguous()
        state[name] = g.dequantized()  # the dense copy holds the grouped values exactly
    save_file(state, str(file), metadata={"format": "pt"})
    shutil.copytree(dense, grouped)
    save_file(out, str(grouped / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((grouped / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gguf_grouped"}
    (grouped / "config.json").write_text(json.dumps(cfg, indent=2))
