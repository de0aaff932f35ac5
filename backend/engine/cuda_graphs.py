"""CUDA graphs for pure-decode steps on a GPU (the Triton ops).

Why: a decode step of a small model is launch-bound. SmolLM2-135M runs ~8 kernels a layer x 30 layers, each Triton
launch costing tens of microseconds of Python on the host, so the GPU mostly waits (63 tok/s at one stream on an
H200, 14 ms a step). A CUDA graph records a step's launches once and replays them in one call.

Design (as vLLM and SGLang do it):

- Sizes: `graph_batch_sizes(max_num_seqs)`, 1, 2, 4, 8, then every 16 up to max_num_seqs (itself included). A step
  of n sequences replays the smallest captured size B >= n; the rows n..B-1 are padding.
- Static inputs, sized for the largest B, of which a graph of size B reads the first B rows: input_ids,
  positions, slot_mapping (int64), seq_lens and block tables (int32). The block tables have a fixed width, the
  blocks a sequence of max_model_len holds, so the paged decode kernel (which picks its split count on the host
  from that width) launches the same grid at capture and replay. The static output is the graph's (B, vocab) fp32
  logits.
- Padding rows are harmless: token 0 at position 0, slot -1 (the KV store writes nothing) and seq_len 0 (paged
  decode gives them zero attention). Their logits are computed and ignored.
- Capture at start, largest size first, all graphs sharing one memory pool: per size an eager warm-up forward on
  all-padding inputs (it compiles the Triton kernels for these shapes and writes no KV), then the captured one.
  Nothing in the forward reads a tensor back to the host (shapes and strides only).
- `run(out)` takes a step only when it is pure decode: no prefill chunk, one new token and one logits row per
  sequence (no draft to verify, no prompt logprobs), and at most the largest size. It writes the rows into pinned
  host buffers, copies them to the static inputs with one non-blocking copy per dtype, replays, and returns a view
  of the first n rows of the static logits, valid until the next replay (the engine samples from it before its
  next step). Sampling, and every other step, stays eager.
- A capture failure logs a warning with the reason and leaves no graph: every step then runs eagerly.
  `stats` counts what happened (captured sizes, replays per size, the error), so tests can see the graphs ran.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

import torch

from backend.engine.kv_cache import KVCacheManager
from backend.engine.scheduler import SchedulerOutput
from backend.model.forward_batch import DecodeMetadata, ForwardBatch
from backend.model.llama import LlamaForCausalLM

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

log = logging.getLogger(__name__)

MAX_GRAPH_BATCH = 256  # larger decode batches run eagerly (their launches are amortised over many rows anyway)


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The padded batch sizes to capture: 1, 2, 4, 8, 16, 32, 48, ... up to and including max_num_seqs (capped)."""
    cap = max(1, min(max_num_seqs, MAX_GRAPH_BATCH))
    return sorted({s for s in (1, 2, 4, 8, *range(16, cap, 16)) if s < cap} | {cap})


def capture_graph(forward: Callable[[], torch.Tensor], pool: _POOL_HANDLE | None) -> tuple[Callable[[], None], torch.Tensor]:
    """Record `forward` in a CUDA graph: (replay, its static output). Tests on a CPU substitute an eager stand-in."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = forward()
    return graph.replay, output


@dataclass(frozen=True)
class _Graph:
    replay: Callable[[], None]
    logits: torch.Tensor  # (size, vocab) fp32, the static output
    batch: ForwardBatch  # its static inputs, held: the graph reads them (logits_index is its own tensor)


@dataclass
class GraphStats:
    captured: list[int] = field(default_factory=list)  # the batch sizes with a graph
    replays: dict[int, int] = field(default_factory=dict)  # size -> steps replayed at it
    error: str | None = None  # why capture failed (then no graph runs)


class DecodeGraphs:
    def __init__(
        self, model: LlamaForCausalLM, kv_cache: torch.Tensor, kv: KVCacheManager, max_num_seqs: int, *, max_model_len: int
    ) -> None:
        self.model, self.kv_cache, self.kv = model, kv_cache, kv
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.width = -(-max_model_len // kv.block_size)  # the block tables' fixed width
        self.max_len = self.width * kv.block_size  # longest context a row may hold
        self.stats = GraphStats()
        self.graphs: dict[int, _Graph] = {}
        rows, device, on_gpu = self.sizes[-1], kv_cache.device, kv_cache.device.type == "cuda"
        # int64 rows: input_ids, positions, slot_mapping; int32: seq_lens, then the (rows, width) block tables
        self.host_i64 = torch.zeros(3, rows, dtype=torch.long, pin_memory=on_gpu)
        self.host_i32 = torch.zeros(rows + rows * self.width, dtype=torch.int32, pin_memory=on_gpu)
        self.dev_i64 = torch.zeros(3, rows, dtype=torch.long, device=device)
        self.dev_i32 = torch.zeros(rows + rows * self.width, dtype=torch.int32, device=device)
        self.copied = torch.cuda.Event() if on_gpu else None  # the last host -> device copy, before host writes
        self._pad(0, rows)
        self.dev_i64.copy_(self.host_i64)
        self.dev_i32.copy_(self.host_i32)

    # ---- capture ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Every size's graph, largest first; on any failure none (logged) and every step runs eagerly."""
        pool = torch.cuda.graph_pool_handle() if self.kv_cache.device.type == "cuda" else None
        try:
            for size in reversed(self.sizes):
                batch = self._batch(size)
                self.model(batch, self.kv_cache)  # warm-up: compiles the kernels; padding rows write no KV
                if pool is not None:
                    torch.cuda.synchronize()
                replay, logits = capture_graph(partial(self.model, batch, self.kv_cache), pool)
                self.graphs[size] = _Graph(replay, logits, batch)
        except Exception as exc:  # whatever failed: run eagerly, and say why
            self.graphs.clear()
            self.stats.error = f"{type(exc).__name__}: {exc}"
            log.warning("CUDA graph capture failed, decode steps run eagerly: %s", self.stats.error)
            return
        self.stats.captured = list(self.sizes)
        self.stats.replays = dict.fromkeys(self.sizes, 0)

    def _batch(self, size: int) -> ForwardBatch:
        """The forward batch of a graph of `size` rows: views of the static inputs."""
        rows = self.sizes[-1]
        ids, positions, slots = self.dev_i64[0, :size], self.dev_i64[1, :size], self.dev_i64[2, :size]
        seq_lens = self.dev_i32[:size]
        tables = self.dev_i32[rows : rows + size * self.width].view(size, self.width)
        # the Triton ops read only block_tables and context_lens; the torch path's gather and masks are not built
        unused = torch.empty(0, device=self.kv_cache.device)
        decode = DecodeMetadata(unused, unused, tables, seq_lens)
        arange = torch.arange(size, device=self.kv_cache.device)
        return ForwardBatch(ids, positions, slots, size, decode, None, arange, self.kv.block_size)

    # ---- replay ----------------------------------------------------------------------------------
    def size_for(self, out: SchedulerOutput) -> int | None:
        """The padded size whose graph runs this step, or None: not a pure decode step, or too large."""
        if not self.graphs or out.prefills or not out.decodes or len(out.decodes) > self.sizes[-1]:
            return None
        for c in out.decodes:
            if c.num_new_tokens != 1 or c.num_logit_rows != 1 or c.wants_prompt_logprobs:
                return None
            if c.seq.num_computed_tokens >= self.max_len:
                return None
        return self.sizes[bisect.bisect_left(self.sizes, len(out.decodes))]

    def run(self, out: SchedulerOutput) -> torch.Tensor | None:
        """(num_decodes, vocab) fp32 logits from a graph's replay, or None: the step must run eagerly."""
        size = self.size_for(out)
        if size is None:
            return None
        n = len(out.decodes)
        if self.copied is not None:
            self.copied.synchronize()  # the previous step's copy has read the host buffers
        rows, bs = self.sizes[-1], self.kv.block_size
        ids, positions, slots = self.host_i64.numpy()
        host_i32 = self.host_i32.numpy()
        seq_lens, tables = host_i32[:rows], host_i32[rows:].reshape(rows, self.width)
        for i, c in enumerate(out.decodes):
            seq, pos = c.seq, c.seq.num_computed_tokens
            ids[i], positions[i], seq_lens[i] = seq.token_ids[pos], pos, pos + 1
            slots[i] = self.kv.slot(seq, pos)
            tables[i, : pos // bs + 1] = [b.block_id for b in seq.block_table[: pos // bs + 1]]
        self._pad(n, size)
        self.dev_i64.copy_(self.host_i64, non_blocking=True)
        used = rows + size * self.width
        self.dev_i32[:used].copy_(self.host_i32[:used], non_blocking=True)
        if self.copied is not None:
            self.copied.record()
        graph = self.graphs[size]
        graph.replay()
        self.stats.replays[size] += 1
        return graph.logits[:n]

    def _pad(self, start: int, stop: int) -> None:
        """Rows start..stop-1 of the host buffers as padding: token 0 at position 0, slot -1, seq_len 0."""
        host_i64 = self.host_i64.numpy()
        host_i64[:2, start:stop] = 0
        host_i64[2, start:stop] = -1
        self.host_i32.numpy()[start:stop] = 0
