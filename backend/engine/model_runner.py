"""ModelRunner: owns the model and the KV cache tensor; turns a SchedulerOutput into logits."""

from __future__ import annotations

import mmap
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from backend.engine.cuda_graphs import DecodeGraphs, GraphStats
from backend.engine.kv_cache import KVCacheManager
from backend.engine.scheduler import ScheduledSeq, SchedulerOutput
from backend.errors import EngineError
from backend.model.forward_batch import DecodeMetadata, ForwardBatch, LayerCaches, PrefillMetadata
from backend.model.llama import LlamaForCausalLM
from backend.quant.cpu_gemm import onednn_available
from backend.quant.gguf_linear import GgufLinear
from backend.quant.int4_linear import Int4Linear
from backend.quant.int8_linear import Int8Linear
from kernels.cpu.paged_decode import supports_dims

if TYPE_CHECKING:
    from transformers import PretrainedConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Chunks of at most this many tokens (speculative verifies, a draft model's catch-up) also get per-token decode
# metadata: the paged decode kernel attends them row by row, as the plain decode steps would (bench/README,
# "speculative"), instead of the padded SDPA path's ~15 small ops a layer.
SHORT_CHUNK = 16


class ServedModel(Protocol):
    """What the runner runs and sizes the KV cache by: a LlamaForCausalLM, or with > 1 rank the parallel Driver in front
    of one (backend/parallel/driver.py, which copies these from it; named here, as the driver imports this module)."""

    @property
    def config(self) -> PretrainedConfig: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def layer_ids(self) -> range: ...
    @property
    def layer_windows(self) -> list[int]: ...
    def __call__(self, batch: ForwardBatch, kv_cache: LayerCaches) -> torch.Tensor: ...


def kv_cache_shape(model: ServedModel, num_blocks: int, block_size: int, num_layers: int | None = None) -> tuple[int, ...]:
    """One slice per layer the model holds (a pipeline stage: only its own; or `num_layers`), KV heads as sharded
    (TP)."""
    c = model.config
    layers = len(model.layer_ids) if num_layers is None else num_layers
    return (layers, 2, num_blocks * block_size, c.num_key_value_heads, model.head_dim)


def allocate_kv_cache(model: ServedModel, num_blocks: int, block_size: int, *, dtype: torch.dtype,
                      device: str, num_layers: int | None = None) -> torch.Tensor:
    """The KV pool, zeros (a masked-out slot must hold a finite value: SDPA's masked softmax still multiplies it). On a
    CPU it is an anonymous memory map: the kernel hands out zero pages as they are first written, so the pool is
    resident only as far as it has been written, not its whole budget from the start (`torch.zeros` writes every
    byte; calloc's zeros are lazy only where the allocator happens to map fresh memory)."""
    shape = kv_cache_shape(model, num_blocks, block_size, num_layers)
    if device != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = mmap.mmap(-1, torch.Size(shape).numel() * dtype.itemsize)  # the tensor keeps the map alive
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)


def kv_cache_dtype(
    name: str, model: nn.Module, model_dtype: torch.dtype, device: str, *, torch_ops: bool, c_decode: bool = False
) -> torch.dtype:
    """The KV cache's dtype. "auto" is the model's, except for quantized (INT4/INT8) fp32 models on a CPU that
    reads bf16 fast: native bf16, or the C decode kernel (`c_decode`, which widens bf16 in registers). There bf16
    K/V halve the bytes every decode step reads per layer (~40% of a 32-stream step's attention time at 128 tokens
    of context, bench/README "KV cache dtype") and double the blocks a budget holds, and the outputs already
    differ from full precision's. Another dtype than the model's needs the torch attention path (the Triton
    kernels and the parallel workers read the model's dtype)."""
    if name == "auto":
        cpu_bf16 = device == "cpu" and torch_ops and (c_decode or onednn_available(torch.bfloat16))
        quantized = any(isinstance(m, (Int4Linear, Int8Linear, GgufLinear)) for m in model.modules())
        return torch.bfloat16 if cpu_bf16 and quantized and model_dtype == torch.float32 else model_dtype
    if name not in DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {name!r}: use auto, float32, bfloat16 or float16")
    if DTYPES[name] != model_dtype and not torch_ops:
        raise ValueError(f"kv_cache_dtype {name} differs from the model's dtype: only the single-process torch path "
                         "(kernel_backend torch, no tensor/pipeline parallelism) supports that")
    return DTYPES[name]


def num_kv_blocks(model: LlamaForCausalLM, block_size: int, memory_mb: int, dtype: torch.dtype) -> int:
    per_block = torch.Size(kv_cache_shape(model, 1, block_size)).numel() * dtype.itemsize
    return max(1, memory_mb * 2**20 // per_block)


def window_pool_blocks(model: LlamaForCausalLM, blocks: int, *, block_size: int, max_num_seqs: int,
                       max_num_batched_tokens: int) -> int:
    """Blocks for a pool of the windowed layers' own, where full layers and windowed layers of one window mix; 0: one
    pool for every layer. Every running sequence's window, plus one step's chunks, always fits it: with its room the
    pool is never what stops a step (about 2 blocks of slack per sequence: the block being written and the window's
    ragged first one), and a quarter of the one-pool budget's blocks when that is more (room for windows a prefix hit
    can reuse). The rest of the budget goes to the full layers (split_kv_blocks). Also 0 when that would not hold more
    context than one pool of `blocks`."""
    windows = model.layer_windows
    window = max(windows, default=0)
    if set(windows) != {0, window} or not window:
        return 0
    need = max_num_seqs * (-(-window // block_size) + 2) + -(-max_num_batched_tokens // block_size) + 1
    window_blocks = max(need, blocks // 4)
    return window_blocks if window_blocks < blocks else 0


def split_kv_blocks(model: LlamaForCausalLM, blocks: int, window_blocks: int) -> int:
    """The full layers' blocks when the windowed layers take `window_blocks` of a budget that holds `blocks` for all."""
    windows = model.layer_windows
    full, windowed = windows.count(0), len(windows) - windows.count(0)
    return (blocks * len(windows) - window_blocks * windowed) // full


def per_token_prefill(model: LlamaForCausalLM, ops_name: str, dtype: torch.dtype, kv_dtype: torch.dtype) -> bool:
    """Whether every prefill chunk attends through the C paged decode kernel, one decode query per token: on the C
    kernels (CpuOps) where the kernel takes the model. A token's attention is then the same arithmetic whatever
    chunk computes it, so a prefix-cache hit, chunked prefill or a batch-mate changes no logit of an INT4 (W4A8)
    model, whose other ops are row-independent; with SDPA for long chunks, a cached prefix flipped near-tie greedy
    tokens (5 of 20 repeated requests). Token by token through the decode entry this cost 1.24x SDPA's time to first
    token at 2,000 tokens; chunks now go through the kernel's tiled prefill entry (the same arithmetic per token, each
    key and value read once for 16 tokens; `python -m bench.prefill_attention` compares it with SDPA)."""
    c = model.config
    return ops_name == "cpu" and supports_dims(c.num_attention_heads, c.num_key_value_heads, model.head_dim, dtype,
        cache_dtype=kv_dtype)


class ModelRunner:
    def __init__(
        self, model: ServedModel, kv: KVCacheManager, kv_dtype: torch.dtype, device: str, *, per_token: bool = False,
        cuda_graphs: bool = False, max_num_seqs: int = 1, max_model_len: int = 0,
    ) -> None:
        """per_token: every prefill chunk gets per-token decode metadata (`per_token_prefill`), not only short ones.
        cuda_graphs: pure-decode steps of up to max_num_seqs sequences replay CUDA graphs (backend/engine/cuda_graphs.py),
        captured here; only on CUDA with the Triton ops and one process, else ignored."""
        self.model = model
        self.kv = kv
        self.device = device
        self.per_token = per_token
        self.window = max(model.layer_windows, default=0)  # sliding window of the windowed layers (0: none)
        windows = model.layer_windows
        self.kv_cache = allocate_kv_cache(model, kv.pool.num_blocks, kv.block_size, dtype=kv_dtype, device=device,
                                          num_layers=None if kv.window_pool is None else windows.count(0))
        self.window_cache: torch.Tensor | None = None  # the windowed layers' own pool (KVCacheManager.window_pool)
        self.layer_caches: LayerCaches = self.kv_cache  # what each layer reads, by layer index
        if kv.window_pool is not None:
            self.window_cache = allocate_kv_cache(model, kv.window_pool.num_blocks, kv.block_size, dtype=kv_dtype,
                                                  device=device, num_layers=len(windows) - windows.count(0))
            full, windowed = iter(self.kv_cache), iter(self.window_cache)
            self.layer_caches = [next(windowed) if w else next(full) for w in windows]
        self.graphs: DecodeGraphs | None = None
        if cuda_graphs and device.startswith("cuda") and isinstance(model, LlamaForCausalLM) and model.ops.name == "triton":
            self.graphs = DecodeGraphs(model, self.kv_cache, kv, max_num_seqs, max_model_len=max_model_len)
            self.graphs.capture()

    @property
    def graph_stats(self) -> GraphStats:
        """Captured sizes and replays per size (empty without graphs)."""
        return self.graphs.stats if self.graphs is not None else GraphStats()

    def _tensor(self, data: list[int] | list[list[int]], dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.tensor(data, dtype=dtype, device=self.device)

    @property
    def kv_bytes(self) -> int:
        """The KV pools' size (on a CPU resident only as far as written: allocate_kv_cache)."""
        return self.kv_cache.nbytes + (0 if self.window_cache is None else self.window_cache.nbytes)

    def _block_tables(self, chunks: list[ScheduledSeq], *, windowed: bool) -> torch.Tensor:
        """Each chunk's block table, padded with block 0: the windowed layers' (`windowed`) or the others'."""
        tables = [c.seq.window_table if windowed else c.seq.block_table for c in chunks]
        width = max(len(t) for t in tables)
        return self._tensor([[b.block_id for b in t] + [0] * (width - len(t)) for t in tables], torch.int32)

    def _context(self, chunks: list[ScheduledSeq], *, windowed: bool) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(block_tables (num_seqs, max_blocks) int32, context_blocks (num_seqs, ctx_blocks) long, context lens):
        the blocks holding every token up to the end of this step's chunk; ctx_blocks * block_size is the padded
        context width the masks cover (padding columns point at block 0 and are masked)."""
        lens = [c.seq.num_computed_tokens + c.num_new_tokens for c in chunks]
        tables = self._block_tables(chunks, windowed=windowed)
        ctx_blocks = -(-max(lens) // self.kv.block_size)
        return tables, tables[:, :ctx_blocks].long(), lens

    def _decode_metadata(self, decodes: list[ScheduledSeq], *, windowed: bool = False) -> DecodeMetadata:
        """One decode query per token: a plain decode's one token, or each token of a verified draft (1 + k) over
        its causal prefix (context up to and including it), as the plain decode steps would attend them.
        windowed: for the windowed layers' own pool (their tables; both masks, to be swapped by with_window)."""
        lens = [c.seq.num_computed_tokens + j + 1 for c in decodes for j in range(c.num_new_tokens)]
        tables = self._block_tables(decodes, windowed=windowed)
        if len(lens) > len(decodes):
            tables = tables.repeat_interleave(self._tensor([c.num_new_tokens for c in decodes]), dim=0)
        blocks = tables[:, : -(-max(lens) // self.kv.block_size)].long()
        width = blocks.shape[1] * self.kv.block_size
        valid = torch.arange(width, device=self.device)[None, :] < self._tensor(lens)[:, None]
        zeros = torch.zeros(valid.shape, dtype=self.kv_cache.dtype, device=self.device)
        mask = zeros.masked_fill(~valid, -float("inf"))
        window_mask = None
        if self.window and (windowed or self.kv.window_pool is None):  # the query at len - 1 sees keys >= len - window
            first = self._tensor(lens)[:, None] - self.window
            in_window = valid & (torch.arange(width, device=self.device)[None, :] >= first)
            window_mask = zeros.masked_fill(~in_window, -float("inf"))[:, None, None, :]
        return DecodeMetadata(blocks, mask[:, None, None, :], tables, self._tensor(lens, torch.int32), window_mask, max(lens))

    def _prefill_metadata(self, prefills: list[ScheduledSeq], first_row: int, *, windowed: bool = False) -> PrefillMetadata:
        tables, blocks, lens = self._context(prefills, windowed=windowed)
        q_lens = [c.num_new_tokens for c in prefills]
        cu = [0]
        for q in q_lens:
            cu.append(cu[-1] + q)
        col = torch.arange(max(q_lens), device=self.device)
        query_valid = col[None, :] < self._tensor(q_lens)[:, None]  # (num_prefills, max_query)
        query_index = (self._tensor(cu[:-1])[:, None] + col[None, :] + first_row).masked_fill(~query_valid, 0)
        q_pos = self._tensor([c.seq.num_computed_tokens for c in prefills])[:, None] + col[None, :]
        k_pos = torch.arange(blocks.shape[1] * self.kv.block_size, device=self.device)
        mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & query_valid[:, :, None]
        window_mask = None
        if self.window and (windowed or self.kv.window_pool is None):  # and k > q - window; padded rows see key 0
            window_mask = mask & (k_pos[None, None, :] > q_pos[:, :, None] - self.window)
            window_mask[:, :, 0] |= ~query_valid
            window_mask = window_mask[:, None]
        mask[:, :, 0] = True  # padded query rows attend to something, so softmax stays finite
        short = self.per_token or max(q_lens) <= SHORT_CHUNK
        return PrefillMetadata(
            query_index, query_valid, blocks, mask[:, None], tables,
            self._tensor(lens, torch.int32), self._tensor(cu, torch.int32), window_mask, short, max(lens),
        )

    def prepare(self, out: SchedulerOutput) -> ForwardBatch:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        window_slots: list[int] = []  # with a window pool: where the windowed layers keep the same positions
        logits_rows: list[int] = []
        for chunk in out.scheduled:
            seq, start = chunk.seq, chunk.seq.num_computed_tokens
            span = range(start, start + chunk.num_new_tokens)
            ids.extend(seq.token_ids[start : start + chunk.num_new_tokens])
            positions.extend(span)
            slots.extend(self.kv.slots(seq.block_table, span))
            if self.kv.window_pool is not None:
                window_slots.extend(self.kv.slots(seq.window_table, span))
            logits_rows.extend(range(len(ids) - chunk.num_logit_rows, len(ids)))
        num_decodes = sum(c.num_new_tokens for c in out.decodes)  # verified drafts are decode rows too
        batch = ForwardBatch(
            input_ids=self._tensor(ids),
            positions=self._tensor(positions),
            slot_mapping=self._tensor(slots),
            num_decode_tokens=num_decodes,
            decode=self._decode_metadata(out.decodes) if out.decodes else None,
            prefill=self._prefill_metadata(out.prefills, num_decodes) if out.prefills else None,
            logits_index=self._tensor(logits_rows),
            block_size=self.kv.block_size,
        )
        return batch if self.kv.window_pool is None else replace(batch, windowed=self._windowed(out, batch, window_slots))

    def _windowed(self, out: SchedulerOutput, batch: ForwardBatch, slots: list[int]) -> ForwardBatch:
        """The batch as the windowed layers see it: their pool's slots and tables, the window masks in place."""
        view = replace(
            batch, slot_mapping=self._tensor(slots),
            decode=self._decode_metadata(out.decodes, windowed=True) if out.decodes else None,
            prefill=self._prefill_metadata(out.prefills, batch.num_decode_tokens, windowed=True) if out.prefills else None,
        )
        return view.with_window(self.window)

    @torch.inference_mode()
    def run(self, out: SchedulerOutput) -> torch.Tensor:
        """(num_logit_rows, vocab) fp32 logits: each scheduled chunk's `num_logit_rows` rows, in order. From a CUDA
        graph they are a view of its static output, valid until the next step."""
        logits = self.graphs.run(out) if self.graphs is not None else None
        return logits if logits is not None else self.model(self.prepare(out), self.layer_caches)

    @torch.inference_mode()
    def run_with_hidden(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor]:
        """As run, plus the final hidden state of every logits row (num_logit_rows, hidden), for Medusa heads."""
        model = self.model
        if not isinstance(model, LlamaForCausalLM) or model.lm_head is None:  # was an AttributeError / TypeError
            raise EngineError("Medusa heads need the whole model in one process (no tensor or pipeline parallelism)")
        hidden = model.hidden_states(self.prepare(out), self.layer_caches)
        return model.lm_head(hidden).float(), hidden
