"""Physical blocks: reference counts, the free LRU queue, and the digest -> cached block map."""

from dataclasses import dataclass, field
from typing import Iterable, Iterator

from pagedllm.errors import InvalidInputError
from pagedllm.kv.ids import BlockHash, BlockId
from pagedllm.kv.prefix import BlockKey


class OutOfBlocksError(RuntimeError):
    """More blocks were asked of the pool than are free: a caller took more than allocate() checked for."""


@dataclass(slots=True, eq=False)
class Block:
    block_id: BlockId
    ref_cnt: int = 0
    block_hash: BlockKey | None = None  # set only while the block is registered in BlockPool.cached
    prev: "Block | None" = field(default=None, repr=False)
    next: "Block | None" = field(default=None, repr=False)


class FreeQueue:
    """Intrusive doubly linked list with head/tail sentinels: O(1) push, pop and removal from the middle."""

    def __init__(self, blocks: Iterable[Block] = ()) -> None:
        self.head = Block(BlockId(-1))
        self.tail = Block(BlockId(-2))
        self.head.next, self.tail.prev = self.tail, self.head
        self.size = 0
        for block in blocks:
            self.push_tail(block)

    def push_tail(self, block: Block) -> None:
        last = self.tail.prev
        block.prev, block.next = last, self.tail
        last.next = block
        self.tail.prev = block
        self.size += 1

    def remove(self, block: Block) -> None:
        if block.prev is None or block.next is None:
            raise RuntimeError(f"block {block.block_id} is not in the free queue")
        block.prev.next, block.next.prev = block.next, block.prev
        block.prev = block.next = None
        self.size -= 1

    def pop_head(self) -> Block:
        block = self.head.next
        if block is self.tail:
            raise OutOfBlocksError("the free queue is empty")
        self.remove(block)
        return block

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Block]:
        node = self.head.next
        while node is not self.tail:
            yield node
            node = node.next


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if not isinstance(num_blocks, int) or num_blocks <= 0:
            raise InvalidInputError(f"num_blocks must be a positive integer, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size <= 0:
            raise InvalidInputError(f"block_size must be a positive integer, got {block_size!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [Block(BlockId(i)) for i in range(num_blocks)]
        # Invariant: a block is in the free queue iff ref_cnt == 0. Least recently freed is at the head.
        self.free_queue = FreeQueue(self.blocks)
        # Invariant: cached[d] is b iff b.block_hash.digest == d; one block per digest.
        self.cached: dict[BlockHash, Block] = {}
        # Invariant: the number of cached blocks with ref_cnt 0 (stats read it every step; a pass over
        # `cached` would cost as much as the pool is large).
        self.num_cached_free_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_new_blocks(self, n: int) -> list[Block]:
        """Pop n blocks from the LRU head, evicting their cached hashes; each comes back with ref_cnt 1."""
        if n > self.num_free_blocks:
            raise OutOfBlocksError(f"asked for {n} blocks but only {self.num_free_blocks} are free")
        out = []
        for _ in range(n):
            block = self.free_queue.pop_head()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: Block) -> None:
        """Forget a free block's hash (it is being reused)."""
        if block.block_hash is not None:
            del self.cached[block.block_hash.digest]
            block.block_hash = None
            self.num_cached_free_blocks -= 1

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference; a free (cached) block leaves the free queue, keeping its hash."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
                self.num_cached_free_blocks -= block.block_hash is not None
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[Block]) -> None:
        """Drop a reference from each, in the order given; those reaching 0 join the queue tail."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed with ref_cnt {block.ref_cnt}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue.push_tail(block)
                self.num_cached_free_blocks += block.block_hash is not None

    def get_cached_block(self, key: BlockKey) -> Block | None:
        """The cached block with exactly this key (full key compared, so a digest collision is a miss)."""
        block = self.cached.get(key.digest)
        if block is None or block.block_hash != key:
            return None
        return block

    def cache_full_block(self, block: Block, key: BlockKey) -> bool:
        """Register a full block under its key. False if the block already has one or another holds the digest
        (a duplicate computed concurrently, or a collision): the block then stays uncached."""
        if block.block_hash is not None or key.digest in self.cached:
            return False
        block.block_hash = key
        self.cached[key.digest] = block
        self.num_cached_free_blocks += block.ref_cnt == 0
        return True

    def uncache(self, block: Block) -> None:
        """Forget a block's hash: the step that was to write its K/V did not run."""
        if block.block_hash is not None and self.cached.get(block.block_hash.digest) is block:
            del self.cached[block.block_hash.digest]
            self.num_cached_free_blocks -= block.ref_cnt == 0
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (False, nothing changed) while an in-use block holds one, since
        that block would stay findable after the reset."""
        if any(b.ref_cnt > 0 for b in self.cached.values()):
            return False
        for block in self.cached.values():
            block.block_hash = None
        self.cached.clear()
        self.num_cached_free_blocks = 0
        return True
