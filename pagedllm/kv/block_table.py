"""One sequence's logical -> physical block map and the slot arithmetic on it."""

from dataclasses import dataclass, field

from pagedllm.kv.ids import BlockId


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """ceil(T / B): the number of blocks that hold T tokens (0 tokens hold no block)."""
    return -(-num_tokens // block_size)


def empty_tail_slots(num_tokens: int, block_size: int) -> int:
    """ceil(T/B)*B - T: unused slots in the tail block, always in [0, B - 1]."""
    return blocks_needed(num_tokens, block_size) * block_size - num_tokens


@dataclass(slots=True)
class BlockTable:
    block_size: int
    blocks: list[BlockId] = field(default_factory=list)
    num_tokens: int = 0

    def slot(self, pos: int) -> tuple[BlockId, int]:
        """Position t lives at (table[t // B], t % B)."""
        if not 0 <= pos < len(self.blocks) * self.block_size:
            raise IndexError(f"position {pos} is outside the {len(self.blocks)} blocks of this table")
        return self.blocks[pos // self.block_size], pos % self.block_size

    def flat_slot(self, pos: int) -> int:
        """Index into the flat KV pool: block_id * B + offset."""
        block_id, offset = self.slot(pos)
        return block_id * self.block_size + offset

    def slot_mapping(self, start: int, end: int) -> list[int]:
        """Flat slots of positions [start, end)."""
        return [self.flat_slot(p) for p in range(start, end)]

    @property
    def num_empty_slots(self) -> int:
        return len(self.blocks) * self.block_size - self.num_tokens

    def tail_is_partial(self) -> bool:
        return self.num_tokens % self.block_size != 0

    def filled(self, index: int) -> int:
        """Slots of block `index` holding this sequence's tokens."""
        return max(0, min(self.block_size, self.num_tokens - index * self.block_size))

    def append(self, block_id: BlockId) -> None:
        self.blocks.append(block_id)

    def replace_tail(self, block_id: BlockId) -> BlockId:
        """Copy-on-write repoint: the only in-place change a table allows besides freeing."""
        old = self.blocks[-1]
        self.blocks[-1] = block_id
        return old

    def copy(self) -> "BlockTable":
        return BlockTable(self.block_size, list(self.blocks), self.num_tokens)
