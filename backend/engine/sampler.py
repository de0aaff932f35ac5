"""Batched sampling: one call per step turns the logits of every sampled row into tokens.

A ladder of small functions, each a no-op for rows that don't use it:
  logit_bias -> min_tokens -> penalties -> greedy | (temperature -> top_k -> top_p -> min_p -> draw)
Draws use the exponential race (argmax p / E with E ~ Exp(1)), which equals sampling from p;
rows with a seed draw E from their own generator, keyed by (seed, choice index, position of the token drawn):
a seeded draw depends on nothing but that key and p, so its text ignores the rest of the batch, and speculative
verification can draw the very token plain decoding would (`seeded_noise`, backend/spec/verify.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from backend.engine.guided import apply_masks
from backend.engine.request import Sequence


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: torch.Tensor | None  # (num_rows, vocab) raw-model log-probabilities, if any row asked


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    for row, seq in enumerate(seqs):
        if seq.params.logit_bias:
            cols = torch.tensor(list(seq.params.logit_bias), device=logits.device)
            logits[row, cols] += torch.tensor(list(seq.params.logit_bias.values()), device=logits.device)


def apply_min_tokens(logits: torch.Tensor, seqs: list[Sequence], eos_token_id: int | None) -> None:
    """Forbid stop tokens until min_tokens have been generated."""
    for row, seq in enumerate(seqs):
        p = seq.params
        if seq.num_output_tokens < p.min_tokens:
            stops = list(p.stop_token_ids) + ([] if p.ignore_eos or eos_token_id is None else [eos_token_id])
            logits[row, stops] = -float("inf")


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    """OpenAI presence/frequency penalties over output tokens; repetition penalty (CTRL) over all tokens."""
    rows = [i for i, s in enumerate(seqs) if s.params.uses_penalties]
    for row in rows:  # penalised rows are rare; their (vocab,) counts are cheap
        p, seq = seqs[row].params, seqs[row]
        out = torch.tensor(seq.output_token_ids, dtype=torch.long, device=logits.device)
        counts = torch.zeros(logits.shape[1], device=logits.device).index_add_(0, out, torch.ones_like(out, dtype=torch.float))
        logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(seq.token_ids)), device=logits.device)
            vals = logits[row, seen]
            logits[row, seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)


def apply_top_k_top_p_min_p(probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Zero out what top_k, top_p and min_p exclude; probs: (rows, vocab), rows sum to 1."""
    top_k = torch.tensor([s.params.top_k if s.params.top_k > 0 else probs.shape[1] for s in seqs], device=probs.device)
    top_p = torch.tensor([s.params.top_p for s in seqs], device=probs.device)
    min_p = torch.tensor([s.params.min_p for s in seqs], device=probs.device)
    if bool((top_k < probs.shape[1]).any() or (top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly above each token
        rank = torch.arange(probs.shape[1], device=probs.device)
        drop = (rank[None, :] >= top_k[:, None]) | (before >= top_p[:, None])
        drop[:, 0] = False  # always keep the most likely token
        probs = probs.scatter(1, order, sorted_p.masked_fill(drop, 0.0))
    if bool((min_p > 0).any()):
        probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs


def seeded_noise(seq: Sequence, position: int, vocab: int, device: torch.device | str) -> torch.Tensor:
    """(vocab,) Exp(1) noise of seeded `seq`'s draw of the token at `position` (its index in token_ids): the
    sequence's generator reseeded from (seed, choice index, position), so the draw is the same however many draws
    (speculative drafts, verifications, batch-mates) came before it."""
    assert seq.generator is not None and seq.params.seed is not None
    key = hashlib.blake2b(f"{seq.params.seed}:{seq.index}:{position}".encode(), digest_size=8).digest()
    seq.generator.manual_seed(int.from_bytes(key, "little") >> 1)
    return torch.empty(vocab, device=device).exponential_(generator=seq.generator)


def draw(probs: torch.Tensor, seqs: list[Sequence], generator: torch.Generator) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_(generator=generator)
    for row, seq in enumerate(seqs):
        if seq.generator is not None:
            noise[row] = seeded_noise(seq, seq.num_tokens, probs.shape[1], probs.device)
    return (probs / noise).argmax(dim=-1)


def is_plain_greedy(seq: Sequence) -> bool:
    """Greedy with nothing to apply before the argmax: no logprobs, bias, penalties, grammar or min_tokens pending."""
    p = seq.params
    return (
        p.greedy and p.logprobs is None and not p.logit_bias and not p.uses_penalties and seq.guide is None
        and seq.num_output_tokens >= p.min_tokens
    )


def greedy_tokens(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first index of its maximum, as torch.argmax). On the CPU through numpy: one
    single-threaded pass, ~10 us a 49,152-wide row, where torch's argmax wakes its OpenMP pool (~30 us idle, over
    100 us when other processes hold the cores: 20 ms for 32 rows, measured on the 2-core dev machine)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        tokens: list[int] = logits.detach().numpy().argmax(axis=-1).tolist()
        return tokens
    return logits.argmax(dim=-1).tolist()


class Sampler:
    def __init__(self, eos_token_id: int | None, seed: int, device: str) -> None:
        self.eos_token_id = eos_token_id
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        """logits: (num_rows, vocab) fp32, one row per sequence in `seqs` (modified in place)."""
        if all(is_plain_greedy(s) for s in seqs):
            return SamplerOutput(greedy_tokens(logits), None)
        want_logprobs = any(s.params.logprobs is not None for s in seqs)
        logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
        apply_logit_bias(logits, seqs)
        apply_min_tokens(logits, seqs, self.eos_token_id)
        apply_penalties(logits, seqs)
        apply_masks(logits, seqs)  # constrained decoding: after every bias, before greedy/sampling
        tokens = torch.tensor(greedy_tokens(logits), device=logits.device)
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if sampled:
            rows = [seqs[i] for i in sampled]
            temps = torch.tensor([s.params.temperature for s in rows], device=logits.device)
            probs = torch.softmax(logits[sampled] / temps[:, None], dim=-1)
            probs = apply_top_k_top_p_min_p(probs, rows)
            tokens[sampled] = draw(probs, rows, self.generator)
        return SamplerOutput(tokens.tolist(), logprobs)
