"""Draft-model proposals: a smaller model with the target's vocabulary guesses k tokens per sequence.

The draft model has its own KV cache tensor with as many blocks as the target's pool, and reads and
writes it through the *target's* block tables: token position p of a sequence lives at the same slot
in both caches. So block allocation, prefix sharing, preemption and freeing need nothing of their own:
whatever owns a block owns both halves of it, and rejected positions are simply overwritten later.

The draft runs lazily, only for sequences that speculate: `seq.num_draft_computed` counts the tokens
whose draft K/V are valid, and the first draft forward of a step catches up from there (usually one
or two tokens: the target's last verified ones; the whole prompt the first time). Its K/V only ever
shape proposals: stale or missing draft K/V could lower the acceptance rate, never change the output.

    draft = DraftModel(model, kv, dtype, device, eos_token_id)
    q = draft.propose(seqs, generator)   # fills each seq's reserved draft tokens; q per sampled seq
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.config import EngineConfig, default_gguf_model_path
from backend.engine.block_pool import KVBlock
from backend.engine.kv_cache import KVCacheManager
from backend.engine.model_runner import ModelRunner, kv_cache_shape
from backend.engine.request import Sequence
from backend.engine.sampler import seeded_noise
from backend.model.llama import LlamaForCausalLM
from backend.model.ops import Ops
from backend.model.weights import load_model, resolve_model_dir
from backend.spec.prefix import needs_processing, process_row, target_probs

DEFAULT_MIN_CONFIDENCE = 0.3  # bench.speculative: see bench/README.md ("speculative")


def load_draft_model(
    config: EngineConfig, target: LlamaForCausalLM, max_model_len: int, ops: Ops
) -> LlamaForCausalLM | None:
    """The configured draft model (default: the default model's INT4 copy, its GGUF blocks), or None without draft
    speculation."""
    if config.speculative_method not in {"ngram", "draft", "medusa"}:
        raise ValueError(f"unknown speculative_method {config.speculative_method!r}: use ngram, draft or medusa")
    if config.speculative_method != "draft" or not config.num_speculative_tokens:
        return None
    path = Path(config.speculative_model).expanduser() if config.speculative_model else default_gguf_model_path()
    draft_dir = resolve_model_dir(path, gguf_blocks=config.quantization == "auto")
    draft = load_model(draft_dir, config, max_model_len, ops, quantization="none")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft model {path} has {draft.config.vocab_size} tokens, the target {target.config.vocab_size}: "
                         "a draft model needs the target's vocabulary")
    if draft.config.max_position_embeddings < max_model_len:
        raise ValueError(f"draft model {path} has {draft.config.max_position_embeddings} positions, fewer than {max_model_len}")
    return draft


def kv_blocks_for_both(
    target: LlamaForCausalLM, draft: LlamaForCausalLM, block_size: int, memory_mb: int, *, dtype: torch.dtype
) -> int:
    """Blocks that fit the KV budget when every block holds the target's and the draft's K/V."""
    per_block = sum(torch.Size(kv_cache_shape(m, 1, block_size)).numel() for m in (target, draft)) * dtype.itemsize
    return max(1, memory_mb * 2**20 // per_block)


@dataclass
class _View:
    """A sequence as ModelRunner reads it, with the draft cache's computed count."""

    token_ids: list[int]
    num_computed_tokens: int
    block_table: list[KVBlock]


@dataclass
class _Chunk:
    seq: _View
    num_new_tokens: int
    num_logit_rows: int = 1


@dataclass
class _Batch:
    """Duck-types SchedulerOutput for ModelRunner: single-token chunks use the decode path."""

    decodes: list[_Chunk] = field(default_factory=list)
    prefills: list[_Chunk] = field(default_factory=list)

    @property
    def scheduled(self) -> list[_Chunk]:
        return self.decodes + self.prefills


class DraftModel:
    def __init__(
        self, model: LlamaForCausalLM, kv: KVCacheManager, dtype: torch.dtype, device: str, *, eos_token_id: int | None
    ) -> None:
        self.runner = ModelRunner(model, kv, dtype, device)  # its own cache tensor, the target's block tables
        self.eos_token_id = eos_token_id
        self.vocab_size = model.config.vocab_size
        # Stop drafting a sequence once the draft's most likely next token is less likely than this: such
        # guesses are mostly rejected, and each costs a draft step and a verified position. Decided before
        # sampling, so every proposed token is still an exact draw from q. (0 = always draft k tokens.)
        self.min_confidence = DEFAULT_MIN_CONFIDENCE

    def propose(self, seqs: list[Sequence], generator: torch.Generator) -> dict[Sequence, torch.Tensor | None]:
        """Overwrite the `num_draft` reserved tokens at the end of each seq with draft-model tokens.

        A seq whose draft loses confidence keeps fewer: its num_draft shrinks (maybe to 0).
        Returns q per seq: (num_draft, vocab) distributions the tokens were sampled from, None if greedy.
        Draft step j feeds each seq's token at position base-1+j (step 0 also catches the cache up).
        """
        base = {s: s.num_tokens - s.num_draft for s in seqs}  # real tokens
        want = {s: s.num_draft for s in seqs}
        q: dict[Sequence, list[torch.Tensor]] = {s: [] for s in seqs}
        consumed = dict.fromkeys(seqs, 0)  # grammar tokens consumed while drafting, rolled back at the end
        for j in range(max(s.num_draft for s in seqs)):
            decodes: list[tuple[Sequence, _Chunk]] = []
            prefills: list[tuple[Sequence, _Chunk]] = []
            for s in (s for s in seqs if j < want[s]):
                start = min(s.num_draft_computed, base[s] - 1) if j == 0 else base[s] - 1 + j
                chunk = _Chunk(_View(s.token_ids, start, s.block_table), base[s] + j - start)
                (decodes if chunk.num_new_tokens == 1 else prefills).append((s, chunk))
            if not decodes and not prefills:
                break  # every draft lost confidence
            batch = _Batch([c for _, c in decodes], [c for _, c in prefills])
            logits = self.runner.run(batch)  # type: ignore[arg-type]  # (num_active, vocab), decodes first
            for row, (s, _) in enumerate(decodes + prefills):
                s.num_draft_computed = base[s] + j  # K/V written through position base-1+j
                token = self._choose(s, logits[row : row + 1], base[s] + j, q[s], consumed=consumed, generator=generator)
                if token is None:
                    want[s] = j
                else:
                    s.token_ids[base[s] + j] = token
        for s in seqs:
            del s.token_ids[base[s] + want[s] :]
            s.num_draft = want[s]
            if consumed[s]:
                s.guide.rollback(consumed[s])
        return {s: (torch.cat(q[s]) if q[s] else None) for s in seqs}

    def _choose(
        self, seq: Sequence, row: torch.Tensor, upto: int, q: list[torch.Tensor], *, consumed: dict[Sequence, int],
        generator: torch.Generator,
    ) -> int | None:
        """Pick the draft token after seq.token_ids[:upto] from row (1, vocab), or None when unsure; record q."""
        guide = seq.guide
        masked = guide is not None and not guide.is_stopped()
        if needs_processing(seq):
            process_row(row, seq, seq.token_ids[:upto], self.eos_token_id, masked=masked)
        probs = target_probs(row, seq) if not seq.params.greedy else torch.softmax(row, dim=-1)  # (1, vocab)
        if float(probs.max()) < self.min_confidence:
            return None
        if seq.params.greedy:
            token = int(row.argmax())
        elif seq.generator is not None:  # the target's noise at this position: the draft guesses the token it draws
            token = int((probs[0] / seeded_noise(seq, upto, probs.shape[1], probs.device)).argmax())
            q.append(probs)
        else:  # the target's filters too (temperature, top-k/p), so q is close to p
            token = int(torch.multinomial(probs[0], 1, generator=seq.generator or generator))
            q.append(probs)
        if masked and guide.consume_token(token):
            consumed[seq] += 1
        return token
