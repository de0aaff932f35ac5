"""KVCacheManager: block tables per sequence, prefix-cache lookups and slot allocation.

A full block's hash chains its parent's hash with its own token ids, so equal hashes mean
equal whole prefixes. Hits are capped so at least the prompt's last token is recomputed:
its logits are needed to sample the first output token.

Sliding windows (backend/model/sliding_window.py) free memory in one of two ways:
- every layer windowed (Mistral; `window` > 0, no `window_pool`): blocks that fell out of the window are freed as
  soon as a step has computed past them; their block-table entries become `null_block`, a shared block whose
  slots the attention masks out;
- windowed and full layers mixed (Gemma 3: five windowed layers to one full), with `window_pool`: the windowed
  layers keep their K/V in a pool of their own, through a second table per sequence (`seq.window_table`, entry i
  for positions [i * block_size, (i + 1) * block_size) as in `block_table`). Only that table frees blocks out of the
  window, so the full layers' memory grows with the context and the windowed layers' with the window. A prefix hit
  needs both: the full table's blocks from the start, and the window table's for the window before the hit's end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.engine.block_pool import BlockPool, KVBlock
from backend.engine.request import Sequence
from backend.model.sliding_window import blocks_out_of_window


def block_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


@dataclass(frozen=True)
class CachedPrefix:
    """A prefix-cache hit: the blocks found for a sequence's first `num_blocks` blocks, in each table."""

    blocks: list[KVBlock] = field(default_factory=list)
    window_blocks: list[KVBlock] = field(default_factory=list)  # with a window pool: null_block before the window

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, window: int = 0, *, window_pool: BlockPool | None = None) -> None:
        """window > 0: the sliding window; without `window_pool` every layer has it (so `pool`'s blocks are freed as
        they leave it), with `window_pool` only the layers whose K/V live there (and only its blocks are freed)."""
        self.pool = pool
        self.block_size = block_size
        self.window = window
        self.window_pool = window_pool
        self.null_block = KVBlock(block_id=0, ref_cnt=1)  # stands for a freed block; never in the pool's lists
        self.queries = 0  # prompt tokens looked up in the prefix cache
        self.hits = 0  # ... of which found

    def _hash_of(self, seq: Sequence, index: int) -> int:
        """Hash of the seq's full block `index`, memoised on the sequence."""
        while len(seq.block_hashes) <= index:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[i - 1] if i else None
            tokens = tuple(seq.token_ids[i * self.block_size : (i + 1) * self.block_size])
            seq.block_hashes.append(block_hash(parent, tokens))
        return seq.block_hashes[index]

    def find_cached_prefix(self, seq: Sequence) -> CachedPrefix:
        """Longest run of cached full blocks at the start of seq (never its last token)."""
        hits: list[KVBlock] = []
        blocks = (seq.num_tokens - 1) // self.block_size
        if seq.params.prompt_logprobs is not None:
            # position p's logits give token p+1's logprob: from `prompt_logprobs_from - 1` on, positions are computed
            blocks = min(blocks, max(seq.params.prompt_logprobs_from - 1, 0) // self.block_size)
        for i in range(blocks):
            block = self.pool.lookup(self._hash_of(seq, i))
            if block is None:
                break
            hits.append(block)
        found = CachedPrefix(hits) if self.window_pool is None else self._with_window(seq, hits)
        self.queries += seq.num_tokens
        self.hits += found.num_blocks * self.block_size
        return found

    def _with_window(self, seq: Sequence, hits: list[KVBlock]) -> CachedPrefix:
        """The longest run of `hits` whose window (what the first recomputed token sees) the window pool holds too."""
        assert self.window_pool is not None
        held = [self.window_pool.lookup(self._hash_of(seq, i)) for i in range(len(hits))]
        for n in range(len(hits), 0, -1):
            start = blocks_out_of_window(n * self.block_size, self.window, self.block_size)
            window = [b for b in held[start:n] if b is not None]
            if len(window) == n - start:
                return CachedPrefix(hits[:n], [self.null_block] * start + window)
        return CachedPrefix()

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, cached: CachedPrefix | None = None) -> bool:
        """Give seq blocks for `num_new_tokens` more tokens (after `cached` hits). False if a pool is short."""
        cached = cached or CachedPrefix()
        total = seq.num_computed_tokens + cached.num_blocks * self.block_size + num_new_tokens
        need = max(-(-total // self.block_size) - len(seq.block_table) - cached.num_blocks, 0)
        if not _room(self.pool, need, cached.blocks):
            return False
        if self.window_pool is not None:  # the window table is as long as the block table, null entries included
            if not _room(self.window_pool, need, cached.window_blocks):
                return False
            self._extend(self.window_pool, seq.window_table, cached.window_blocks, need)
        self._extend(self.pool, seq.block_table, cached.blocks, need)
        seq.num_computed_tokens += cached.num_blocks * self.block_size
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that became full of computed tokens in this step."""
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(seq.num_registered_blocks, num_full):
            self.pool.register(seq.block_table[i], self._hash_of(seq, i))
            if self.window_pool is not None and seq.window_table[i] is not self.null_block:
                self.window_pool.register(seq.window_table[i], self._hash_of(seq, i))
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)
        if self.window:
            self.free_out_of_window(seq)

    def free_out_of_window(self, seq: Sequence) -> None:
        """Free the windowed layers' blocks no later query of seq can attend to (they stay findable in the prefix
        cache)."""
        pool, table = (self.pool, seq.block_table) if self.window_pool is None else (self.window_pool, seq.window_table)
        gone = blocks_out_of_window(seq.num_computed_tokens, self.window, self.block_size)
        for i in range(min(gone, seq.num_registered_blocks)):
            if table[i] is not self.null_block:
                pool.free(table[i])
                table[i] = self.null_block

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first, so the tail is evicted before the shared prefix."""
        for pool, table in self._tables(seq):
            for block in reversed(table):
                if block is not self.null_block:
                    pool.free(block)
            table.clear()
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
        seq.num_draft_computed = 0  # the blocks go back to the pool: so does the draft model's K/V in them

    def trim(self, seq: Sequence) -> None:
        """Free whole blocks past the computed tokens (after rejected draft tokens were cut off)."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        for pool, table in self._tables(seq):
            while len(table) > keep:
                pool.free(table.pop())

    def _extend(self, pool: BlockPool, table: list[KVBlock], cached: list[KVBlock], need: int) -> None:
        for block in cached:
            if block is not self.null_block:
                pool.touch(block)
        table.extend(cached)
        table.extend(pool.allocate() for _ in range(need))

    def _tables(self, seq: Sequence) -> list[tuple[BlockPool, list[KVBlock]]]:
        tables = [(self.pool, seq.block_table)]
        return tables if self.window_pool is None else [*tables, (self.window_pool, seq.window_table)]

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size].block_id * self.block_size + position % self.block_size

    def slots(self, table: list[KVBlock], span: range) -> list[int]:
        """Where each position of `span` keeps its K/V in `table`'s pool (a sequence's block or window table)."""
        bs = self.block_size
        return [table[p // bs].block_id * bs + p % bs for p in span]


def _room(pool: BlockPool, need: int, cached: list[KVBlock]) -> bool:
    """Whether `pool` can hand out `need` new blocks after taking the cached hits (free ones leave the free list)."""
    return need <= pool.num_free - sum(1 for b in cached if b.ref_cnt == 0)
