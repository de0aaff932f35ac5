"""BlockPool: the KV cache's blocks, their ref counts and the prefix-cache index.

A block is free when its ref_cnt is 0. Free blocks wait in LRU order; a free block that
still holds a full, hashed block of tokens stays findable in the prefix cache until it is
handed out again (evicted), so a finished conversation's KV is reused by its next turn.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None  # set once the block is full and registered


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[int, KVBlock] = {}  # block_hash -> block

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def lookup(self, block_hash: int) -> KVBlock | None:
        return self.cached.get(block_hash) if self.enable_caching else None

    def allocate(self) -> KVBlock:
        """Take the least recently freed block, evicting its cached content if any."""
        _, block = self.free_queue.popitem(last=False)
        if block.block_hash is not None:
            self.cached.pop(block.block_hash, None)
            block.block_hash = None
        block.ref_cnt = 1
        return block

    def touch(self, block: KVBlock) -> None:
        """Take one more reference on a (possibly free but cached) block."""
        if block.ref_cnt == 0:
            del self.free_queue[block.block_id]
        block.ref_cnt += 1

    def free(self, block: KVBlock) -> None:
        block.ref_cnt -= 1
        assert block.ref_cnt >= 0, f"block {block.block_id} freed twice"
        if block.ref_cnt == 0:
            self.free_queue[block.block_id] = block

    def register(self, block: KVBlock, block_hash: int) -> None:
        """Make a full block findable by its hash (the first block with a given hash wins)."""
        if self.enable_caching and block.block_hash is None and block_hash not in self.cached:
            block.block_hash = block_hash
            self.cached[block_hash] = block
