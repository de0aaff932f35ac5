"""KVCacheManager: block tables per sequence, prefix-cache lookups and slot allocation.

A full block's hash chains its parent's hash with its own token ids, so equal hashes mean
equal whole prefixes. Hits are capped so at least the prompt's last token is recomputed:
its logits are needed to sample the first output token.

With sliding-window attention in every layer (`window` > 0), blocks that fell out of the window are freed as
soon as a step has computed past them; their block-table entries become `null_block`, a shared block whose
slots the attention masks out (backend/model/sliding_window.py).
"""

from __future__ import annotations

from collections.abc import Collection

from backend.engine.block_pool import BlockPool, KVBlock
from backend.engine.request import Sequence
from backend.model.sliding_window import blocks_out_of_window


def block_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((parent, token_ids))


class KVCacheManager:
    def __init__(self, pool: BlockPool, block_size: int, window: int = 0) -> None:
        self.pool = pool
        self.block_size = block_size
        self.window = window  # > 0: every layer sees only this many tokens back, so older blocks are freed
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

    def find_cached_prefix(self, seq: Sequence) -> list[KVBlock]:
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
        self.queries += seq.num_tokens
        self.hits += len(hits) * self.block_size
        return hits

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, cached: Collection[KVBlock] = ()) -> bool:
        """Give seq blocks for `num_new_tokens` more tokens (after `cached` hits). False if the pool is short."""
        total = seq.num_computed_tokens + len(cached) * self.block_size + num_new_tokens
        need = -(-total // self.block_size) - len(seq.block_table) - len(cached)
        reclaimable = sum(1 for b in cached if b.ref_cnt == 0)  # touching these takes them off the free list
        if need > self.pool.num_free - reclaimable:
            return False
        for block in cached:
            self.pool.touch(block)
        seq.block_table.extend(cached)
        seq.num_computed_tokens += len(cached) * self.block_size
        seq.block_table.extend(self.pool.allocate() for _ in range(max(need, 0)))
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks that became full of computed tokens in this step."""
        num_full = seq.num_computed_tokens // self.block_size
        for i in range(seq.num_registered_blocks, num_full):
            self.pool.register(seq.block_table[i], self._hash_of(seq, i))
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)
        if self.window:
            self.free_out_of_window(seq)

    def free_out_of_window(self, seq: Sequence) -> None:
        """Free the blocks no later query of seq can attend to (they stay findable in the prefix cache)."""
        gone = blocks_out_of_window(seq.num_computed_tokens, self.window, self.block_size)
        for i in range(min(gone, seq.num_registered_blocks)):
            if seq.block_table[i] is not self.null_block:
                self.pool.free(seq.block_table[i])
                seq.block_table[i] = self.null_block

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks, tail first, so the tail is evicted before the shared prefix."""
        for block in reversed(seq.block_table):
            if block is not self.null_block:
                self.pool.free(block)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0
        seq.num_draft_computed = 0  # the blocks go back to the pool: so does the draft model's K/V in them

    def trim(self, seq: Sequence) -> None:
        """Free whole blocks past the computed tokens (after rejected draft tokens were cut off)."""
        keep = -(-seq.num_computed_tokens // self.block_size)
        while len(seq.block_table) > keep:
            self.pool.free(seq.block_table.pop())

    def slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size].block_id * self.block_size + position % self.block_size
