"""LLMEngine: the synchronous core. One step = schedule -> run the model -> postprocess.

    out = scheduler.schedule()          # who runs, how many tokens each
    logits = runner.run(out)            # one packed forward over the paged KV cache
    return self.postprocess(out, ...)   # sample, append, stop checks, free finished blocks
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque

import torch

from backend.config import EngineConfig
from backend.engine.block_pool import BlockPool
from backend.engine.detokenizer import IncrementalDetokenizer
from backend.engine.guided import GrammarCache, advance
from backend.engine.kv_cache import KVCacheManager
from backend.engine.model_runner import (
    DTYPES,
    ModelRunner,
    kv_cache_dtype,
    num_kv_blocks,
    per_token_prefill,
    split_kv_blocks,
    window_pool_blocks,
)
from backend.engine.outputs import EngineStats, RequestOutput, SpecSourceStats, TokenLogprob
from backend.engine.request import Sequence, request_output
from backend.engine.sampler import Sampler
from backend.engine.sampling_params import SamplingParams
from backend.engine.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from backend.errors import ContextLengthError, InvalidRequestError
from backend.model.ops import select_ops
from backend.model.ranks import Driver, parallel_ranks
from backend.model.sliding_window import freeable_window
from backend.model.tokenizer import load_tokenizer, set_chat_template
from backend.model.weights import load_model, model_max_len, resolve_model_dir, serving_quantization
from backend.spec.draft_model import DraftModel, kv_blocks_for_both, load_draft_model
from backend.spec.medusa import MedusaDrafter, load_medusa_heads
from backend.spec.speculator import Speculator

log = logging.getLogger(__name__)

_QUANTIZED_LAYERS = ("Int4Linear", "Int8Linear", "LowBitHead", "GgufLinear")
_SHAPE = re.compile(r"\b(in|out)=\d+,\s*")


def kernel_modes(model: torch.nn.Module) -> list[str]:
    """How the quantized layers run (their extra_repr without the shapes: INT4 mode w4a8 / int4pack / triton, int8 or
    W8A8 lm_head; `dense` when they also keep a dense copy for batched calls); [] for a full-precision model."""
    modes = set()
    for m in model.modules():
        if type(m).__name__ in _QUANTIZED_LAYERS:
            dense = ", dense" if getattr(m, "dense", None) is not None else ""
            modes.add(f"{type(m).__name__}({_SHAPE.sub('', m.extra_repr())}{dense})")
    return sorted(modes)


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = config.resolved_device()
        dtype = DTYPES[config.dtype]
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        torch.set_flush_denormal(True)  # denormals made the CPU forward ~2x slower
        model_dir = resolve_model_dir(config.resolved_model(), gguf_blocks=config.quantization == "auto")
        self.model_name = config.served_model_name or config.resolved_model().name.removesuffix(".gguf")
        self.tokenizer = load_tokenizer(model_dir)
        hf_max = model_max_len(model_dir)
        self.max_model_len = config.context_len(hf_max)
        ops = select_ops(config.kernel_backend, self.device, config.block_size)
        # > 1 rank: rank 0 drives (this engine); backend/parallel/driver.py's workers follow its batches
        tp, pp = parallel_ranks(config.tensor_parallel_size, config.pipeline_parallel_size)
        quantization = serving_quantization(config.resolved_model(), model_dir, config.quantization, self.device,
                                            parallel=tp is not None or pp is not None)
        model = load_model(model_dir, config, self.max_model_len, ops, quantization=quantization, tp=tp, pp=pp)
        draft = load_draft_model(config, model, self.max_model_len, ops)
        heads = load_medusa_heads(config, model.config.vocab_size, model.config.hidden_size, dtype, device=self.device)
        single = tp is None and pp is None
        kv_dtype = kv_cache_dtype(
            config.kv_cache_dtype, model, dtype, self.device, torch_ops=single and ops.name != "triton",
                c_decode=ops.name == "cpu"
        )
        per_token = per_token_prefill(model, ops.name, dtype, kv_dtype)  # the pipeline's stages attend alike
        # The `auto` settings as resolved on this machine: part of the gateway's response-cache fingerprint.
        self.output_identity = {
            "device": self.device, "kernels": ops.name, "kv_cache_dtype": str(kv_dtype).removeprefix("torch."),
            "per_token_prefill": per_token, "layers": kernel_modes(model), "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }  # fmt: skip
        # what the runner calls: the model, or with > 1 rank the Driver that hands each batch to the workers too (it
        # reads the same shapes: the KV budget is the model's)
        served = model if single else Driver(model)
        blocks = num_kv_blocks(model, config.block_size, config.kv_cache_memory_mb, kv_dtype) if draft is None else \
            kv_blocks_for_both(model, draft, config.block_size, config.kv_cache_memory_mb, dtype=kv_dtype)
        if isinstance(served, Driver):
            served.share_num_blocks(blocks)
        # windowed and full layers mixed (Gemma 3): the windowed layers' K/V in a pool of their own, sized by the window
        # (not with a draft model, which reads the target's one table, nor under CUDA graphs' static tables)
        split = config.kv_window_pool and single and draft is None and not (config.cuda_graphs and self.device.startswith("cuda"))
        window_blocks = window_pool_blocks(model, blocks, block_size=config.block_size, max_num_seqs=config.max_num_seqs,
                                           max_num_batched_tokens=config.max_num_batched_tokens) if split else 0
        if window_blocks:
            self.kv = KVCacheManager(
                BlockPool(split_kv_blocks(model, blocks, window_blocks), config.enable_prefix_caching), config.block_size,
                max(model.layer_windows), window_pool=BlockPool(window_blocks, config.enable_prefix_caching))
        else:
            self.kv = KVCacheManager(BlockPool(blocks, config.enable_prefix_caching), config.block_size,
                                     freeable_window(model.config))
        self.scheduler = Scheduler(self.kv, config)
        self.runner = ModelRunner(
            served, self.kv, kv_dtype, self.device, per_token=per_token, cuda_graphs=config.cuda_graphs and single,
            max_num_seqs=config.max_num_seqs, max_model_len=self.max_model_len,
        )
        self.eos_token_id = self.tokenizer.eos_token_id
        # what ends an answer: EOS, and a configured chat template's end-of-turn tokens (Gemma's <end_of_turn>)
        turn_ends = set_chat_template(self.tokenizer, config.chat_template) if config.chat_template else []
        self.end_token_ids = frozenset({self.eos_token_id, *turn_ends})
        self.vocab_size = model.config.vocab_size
        self.sampler = Sampler(self.eos_token_id, config.seed, self.device)
        self.grammars = GrammarCache(self.tokenizer, self.vocab_size)
        self.speculator = Speculator(
            self.kv, config, self.max_model_len, self.eos_token_id,
            draft_model=None if draft is None else DraftModel(draft, self.kv, kv_dtype, self.device,
                eos_token_id=self.eos_token_id),
            medusa=None if heads is None else MedusaDrafter(heads, config.medusa_min_confidence),
        )
        self.requests: dict[str, list[Sequence]] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._rate_window: deque[tuple[float, int]] = deque()
        release_freed_memory()  # the loader's transient copies (a GGUF's float32 state dict, fused projections)
        log.info("%s loaded on %s: %s kernels, quantization %s, %d KV blocks of %d tokens%s, context %d", self.model_name,
                 self.device, ops.name, quantization, self.kv.pool.num_blocks, config.block_size,
                 f" (+ {window_blocks} for the windowed layers)" if window_blocks else "", self.max_model_len)

    # ---- requests in ----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._validate(request_id, prompt_token_ids, params)
        if params.max_tokens is None:
            from dataclasses import replace

            params = replace(params, max_tokens=self.max_model_len - len(prompt_token_ids))
        seqs: list[Sequence] = []
        for index in range(params.n):
            gen = None
            if params.seed is not None:
                gen = torch.Generator(device=self.device).manual_seed(params.seed + index)
            detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.stop)
            first = seqs[0] if seqs and self.config.enable_prefix_caching else None
            seq = Sequence(request_id, index, list(prompt_token_ids), len(prompt_token_ids), params, detok, gen, first)
            if params.spec_reference:
                seq.reference_ids = self.tokenizer.encode(params.spec_reference, add_special_tokens=False)
            seqs.append(seq)
        for seq in seqs:  # n>1 siblings each get their own matcher
            seq.guide = self.grammars.new_matcher(params)
        self.scheduler.add(seqs)
        self.requests[request_id] = seqs
        self.prompt_tokens_total += len(prompt_token_ids)

    def _validate(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        if request_id in self.requests:
            raise InvalidRequestError(f"duplicate request id {request_id!r}")
        if not prompt:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise InvalidRequestError(f"prompt token ids must be in [0, {self.vocab_size})", param="prompt")
        if any(not 0 <= t < self.vocab_size for t in [*params.logit_bias, *params.stop_token_ids]):
            raise InvalidRequestError(f"token ids must be in [0, {self.vocab_size})", param="logit_bias")
        self.grammars.validate(params)  # compiles (and caches) the grammar; unsupported schemas fail here
        total = len(prompt) + (params.max_tokens or 1)
        if total > self.max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{total} tokens ({len(prompt)} in the messages, {params.max_tokens or 1} in the completion). "
                "Please reduce the length of the messages or completion.",
                param="messages",
            )
        if -(-total // self.kv.block_size) > self.kv.pool.num_blocks:
            raise ContextLengthError(f"the request needs more KV cache ({total} tokens) than the engine has", param="max_tokens")

    def abort(self, request_id: str) -> RequestOutput | None:
        seqs = self.requests.pop(request_id, None)
        if seqs is None:
            return None
        for seq in seqs:
            if not seq.is_finished:
                seq.drop_draft()  # an unverified draft is not output
                self.scheduler.finish(seq, "abort")
        return request_output(request_id, seqs, finished=True)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    # ---- one step ----------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        self.speculator.propose(self.scheduler.running)
        out = self.scheduler.schedule()
        self.speculator.draft(out, self.sampler.generator)
        if not out.num_tokens:
            return self.postprocess(out, None)
        if self.speculator.medusa is None:
            return self.postprocess(out, self.runner.run(out))
        return self.postprocess(out, *self.runner.run_with_hidden(out))  # Medusa heads read the hidden states

    def postprocess(
        self, out: SchedulerOutput, logits: torch.Tensor | None, hidden: torch.Tensor | None = None
    ) -> list[RequestOutput]:
        """hidden: (rows, hidden) the logits rows' final hidden states, when Medusa heads draft."""
        plan = self._plan_logit_rows(out)  # read before num_computed_tokens moves
        for chunk, rows, _ in plan:
            if chunk.wants_prompt_logprobs and logits is not None:
                self._record_prompt_logprobs(chunk.seq, chunk.seq.num_computed_tokens, logits[rows])
            chunk.seq.num_computed_tokens += chunk.num_new_tokens
        if logits is not None:
            sampled = [(c.seq, r.stop - 1) for c, r, samples in plan if samples and not c.seq.num_draft]
            self._sample(sampled, logits)
            for chunk, rows, _ in plan:
                if chunk.seq.num_draft:
                    self._verify_draft(chunk.seq, logits[rows], None if hidden is None else hidden[rows])
            if hidden is not None:
                for seq, row in sampled:
                    self.speculator.remember(seq, hidden[row])
        for chunk, _, _ in plan:
            if not chunk.seq.is_finished:
                self.kv.cache_full_blocks(chunk.seq)
        touched = {c.seq.request_id for c, _, samples in plan if samples}
        return [o for rid in touched if (o := self._collect(rid)) is not None]

    @staticmethod
    def _plan_logit_rows(out: SchedulerOutput) -> list[tuple[ScheduledSeq, slice, bool]]:
        """(chunk, its logits rows, whether it samples): chunks own `num_logit_rows` consecutive rows."""
        plan, row = [], 0
        for chunk in out.scheduled:
            plan.append((chunk, slice(row, row + chunk.num_logit_rows), chunk.samples))
            row += chunk.num_logit_rows
        return plan

    def _sample(self, rows: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
        """One batched sampler call over the last row of every sampling chunk without a draft."""
        if not rows:
            return
        seqs, index = [seq for seq, _ in rows], [row for _, row in rows]
        if index != list(range(len(logits))):  # else every row samples: no (rows, vocab) copy (4 ms at 32 rows)
            logits = logits.index_select(0, torch.tensor(index, device=logits.device))
        sampled = self.sampler(logits, seqs)
        for i, (seq, token) in enumerate(zip(seqs, sampled.token_ids, strict=True)):
            self._append_token(seq, token, None if sampled.logprobs is None else sampled.logprobs[i])

    def _verify_draft(self, seq: Sequence, logits: torch.Tensor, hidden: torch.Tensor | None) -> None:
        """Emit the accepted draft tokens plus one from the target; stop early if a stop condition hits."""
        raw = torch.log_softmax(logits, dim=-1) if seq.params.logprobs is not None else None
        for i, token in enumerate(self.speculator.verify(seq, logits, self.sampler.generator, hidden)):
            self._append_token(seq, token, None if raw is None else raw[i])
            if seq.is_finished:
                break

    def _record_prompt_logprobs(self, seq: Sequence, start: int, logits: torch.Tensor) -> None:
        """Row j (position start+j) predicts the prompt token at start+j+1. Idempotent across preemptions. The first
        prompt token has no logprob, nor do those before `prompt_logprobs_from` (the prefix cache may have served
        them: then this chunk starts past them)."""
        # targets (prompt tokens) this chunk's rows reach, end exclusive; none for the first token nor before `from`
        end = min(start + logits.shape[0], seq.num_prompt_tokens - 1) + 1
        wanted = max(seq.params.prompt_logprobs_from, 1, start + 1)
        seq.prompt_logprobs.extend([None] * (min(wanted, end) - len(seq.prompt_logprobs)))
        lo = len(seq.prompt_logprobs)  # a preempted sequence recomputes rows it already recorded: from here on
        if lo < end:
            logprobs = torch.log_softmax(logits[lo - start - 1 : end - start - 1], dim=-1)
            seq.prompt_logprobs.extend(self._token_logprobs(logprobs, seq.token_ids[lo:end], seq.params.prompt_logprobs or 0))

    def _append_token(self, seq: Sequence, token: int, logprobs: torch.Tensor | None) -> None:
        """logprobs: (vocab,) raw-model log-probabilities at this position, when the request wants them."""
        seq.token_ids.append(token)
        seq.pending_token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = time.monotonic()
        self.generation_tokens_total += 1
        if logprobs is not None and seq.params.logprobs is not None:
            seq.pending_logprobs.append(self._token_logprob(logprobs, token, seq.params.logprobs))
        self._check_stop(seq, token)

    def _check_stop(self, seq: Sequence, token: int) -> None:
        stop_str = seq.detokenizer.append(token)
        grammar_done = seq.guide is not None and advance(seq.guide, token)
        p = seq.params
        if seq.num_output_tokens < p.min_tokens and not grammar_done:  # a complete grammar allows nothing more
            return
        if stop_str is not None:
            self.scheduler.finish(seq, "stop", stop_str)
        elif token in self.end_token_ids and not p.ignore_eos:
            self.scheduler.finish(seq, "stop", None)
        elif token in p.stop_token_ids:
            self.scheduler.finish(seq, "stop", token)
        elif grammar_done:
            self.scheduler.finish(seq, "stop", None)
        elif seq.num_output_tokens >= (p.max_tokens or 0) or seq.num_tokens >= self.max_model_len:
            self.scheduler.finish(seq, "length")

    def _token_logprob(self, row: torch.Tensor, token: int, k: int) -> TokenLogprob:
        """row: (vocab,) log-probabilities at one position."""
        return self._token_logprobs(row.unsqueeze(0), [token], k)[0]

    def _token_logprobs(self, logprobs: torch.Tensor, tokens: list[int], k: int) -> list[TokenLogprob]:
        """Each row's target token with its log-probability and the row's top k: (rows, vocab) log-probabilities,
        one target per row; one gather and one top-k for all rows (row by row cost ~0.1 ms each at 49k vocab)."""
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device).unsqueeze(1)).squeeze(1).tolist()
        # top-1 (the cache verifier's greedy check): max is ~3x faster than topk
        top = logprobs.topk(k, dim=-1) if k > 1 else logprobs.max(dim=-1, keepdim=True) if k else None
        ids, lps = (top.indices.tolist(), top.values.tolist()) if top is not None else ([()] * len(tokens),) * 2
        decode = self.tokenizer.decode
        alts = [tuple((t, decode([t]), lp) for t, lp in zip(r, v, strict=True)) for r, v in zip(ids, lps, strict=True)]
        return [TokenLogprob(token, decode([token]), chosen[i], alts[i]) for i, token in enumerate(tokens)]

    # ---- outputs -----------------------------------------------------------------------------
    def _collect(self, request_id: str) -> RequestOutput | None:
        seqs = self.requests.get(request_id)
        if seqs is None:
            return None
        finished = all(s.is_finished for s in seqs)
        if finished:
            del self.requests[request_id]
        return request_output(request_id, seqs, finished)

    def _tokens_per_s(self) -> float:
        """Generation throughput over the last ~10 s of stats() calls (the loop calls it every step)."""
        now = time.monotonic()
        self._rate_window.append((now, self.generation_tokens_total))
        while len(self._rate_window) > 2 and now - self._rate_window[0][0] > 10.0:
            self._rate_window.popleft()
        (t0, n0), (t1, n1) = self._rate_window[0], self._rate_window[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def stats(self) -> EngineStats:
        pool = self.kv.pool
        hit_rate = self.kv.hits / self.kv.queries if self.kv.queries else 0.0
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=pool.num_blocks - pool.num_free,
            kv_blocks_total=pool.num_blocks,
            prefix_cache_queries=self.kv.queries,
            prefix_cache_hits=self.kv.hits,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            num_preemptions=self.scheduler.num_preemptions,
            extra={
                "generation_tokens_per_s": self._tokens_per_s(),
                "prefix_cache_hit_rate": hit_rate,
                "spec_proposed_tokens": float(self.speculator.stats.proposed),
                "spec_accepted_tokens": float(self.speculator.stats.accepted),
                "spec_mean_acceptance_length": self.speculator.stats.accepted / max(self.speculator.stats.verifications, 1),
            },
            spec_sources={name: SpecSourceStats(c.proposed, c.accepted) for name, c in self.speculator.stats.by_source.items()},
        )


def release_freed_memory() -> None:
    """Hand memory freed by the load back to the OS: glibc keeps freed heap pages mapped, and the loader's transient
    copies left 0.5 GB resident for Gemma 3 270M. A no-op where the C library has no malloc_trim."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)
