"""Training text for Medusa heads: the base model's own greedy answers to chat requests about the shipped text.

Heads trained on "continue this passage" text learn how prose continues, but the engine serves chat answers,
whose token statistics differ (head 0 agreed with the base on 24% of held-out passage positions and on 2% of
its chat answers). Self-distillation on generated text (as Medusa-2 does) trains on exactly what the heads
will be asked to predict: the base's own continuations of chat answers. Our engine generates them (greedy,
batched); the samples are cached next to the heads so re-training skips generation.
"""

from __future__ import annotations

from pathlib import Path

import torch

from backend.quant.calibration import token_ids

PASSAGE_TOKENS = 64
TEMPLATES = (  # kinds of request a chat model gets about a text; the bench's own prompts are not among them
    "Summarize this passage in two sentences:\n{p}",
    "What is the main point of this text?\n{p}",
    "Explain this to a beginner:\n{p}",
    "Tell me more about the topic of this text.\n{p}",
    "Write three bullet points about this:\n{p}",
    "What questions does this passage raise?\n{p}",
    # Open-chat kinds (a poem, tips, a why-question) anchored on the passage, so the heads also see the style of
    # answers to open requests; the bench's own chat prompts are not among them.
    "Write a short poem inspired by this text:\n{p}",
    "Give me a few practical tips related to this passage:\n{p}",
    "Why does this matter? Answer briefly.\n{p}",
    "Using only this context, answer: who or what is it about?\n{p}",
)
VERSION = 2  # in the cache's file name: a change of TEMPLATES or of the request order regenerates the answers


def chat_requests(tokenizer: object, path: Path, limit: int) -> list[list[dict[str, str]]]:
    """`limit` user messages: every passage of the text once with the request kinds taken in turn, then again
    with the next kind (more answers than passages without repeating a request)."""
    ids = token_ids(tokenizer, path)
    passages = [tokenizer.decode(ids[i : i + PASSAGE_TOKENS]) for i in range(0, len(ids), PASSAGE_TOKENS)]  # type: ignore[attr-defined]
    kinds = [(i + n // len(passages)) % len(TEMPLATES) for n, i in enumerate(list(range(len(passages))) * len(TEMPLATES))]
    requests = [TEMPLATES[k].format(p=passages[n % len(passages)]) for n, k in enumerate(kinds)]
    return [[{"role": "user", "content": r}] for r in requests[:limit]]


def generate_answers(model_dir: Path, requests: list[list[dict[str, str]]], max_tokens: int) -> list[tuple[list[int], int]]:
    """(prompt + greedy answer token ids, where the answer starts) per request, from our engine (full precision)."""
    from backend.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine
    from backend.engine.sampling_params import SamplingParams
    from backend.model.tokenizer import apply_chat_template

    engine = LLMEngine(EngineConfig(model=str(model_dir), quantization="none", max_num_seqs=32))
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    prompts = {f"m{i}": apply_chat_template(engine.tokenizer, msgs) for i, msgs in enumerate(requests)}
    answers: dict[str, list[int]] = {rid: [] for rid in prompts}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params)
    while engine.has_work:
        for out in engine.step():
            answers[out.request_id].extend(t for d in out.deltas for t in d.token_ids)
    return [(prompts[rid] + answers[rid], len(prompts[rid])) for rid in prompts]


def cached_answers(
    cache: Path, model_dir: Path, tokenizer: object, path: Path, *, limit: int, max_tokens: int
) -> list[tuple[list[int], int]]:
    """generate_answers over chat_requests(path), kept in `cache` (a torch file) for the next run."""
    if cache.exists():
        cached: list[tuple[list[int], int]] = torch.load(cache)  # what the torch.save below wrote
        return cached
    samples = generate_answers(model_dir, chat_requests(tokenizer, path, limit), max_tokens)
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(samples, cache)
    return samples
