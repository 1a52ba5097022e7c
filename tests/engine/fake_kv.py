"""A small stand-in for KVCacheManager: block counting with refcounts, no prefix cache, a log of calls.

Enough for the scheduler's decisions (what fits, what is freed, who shares); KVCacheManager's own
behaviour is tested in tests/kv."""

from pagedllm.kv.manager import Allocation, PrefixHit


class FakeKV:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_blocks = list(range(num_blocks))
        self.refs = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, int] = {}
        self.forks: list[tuple[int, int]] = []

    def lookup_prefix(self, token_ids, extra_keys=()) -> PrefixHit:
        return PrefixHit([], 0)

    def allocate(self, seq_id, token_ids, num_new_tokens, prefix=None, extra_keys=(),
                 count_lookup=True) -> Allocation | None:
        table = self.tables.get(seq_id, [])
        have = self.tokens.get(seq_id, 0)
        cow = bool(table) and have % self.block_size != 0 and self.refs[table[-1]] > 1
        grow = -(-(have + num_new_tokens) // self.block_size) - len(table)
        if grow + cow > len(self.free_blocks):
            return None
        copies = []
        table = self.tables.setdefault(seq_id, table)
        if cow:
            new = self._take()
            self.refs[table[-1]] -= 1
            copies.append((table[-1], new))
            table[-1] = new
        table += [self._take() for _ in range(grow)]
        self.tokens[seq_id] = have + num_new_tokens
        return Allocation([], copies)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def _take(self) -> int:
        block = self.free_blocks.pop(0)
        self.refs[block] = 1
        return block

    def fork(self, parent, child) -> None:
        self.forks.append((parent, child))
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = self.tokens[parent]
        for block in self.tables[child]:
            self.refs[block] += 1

    def free(self, seq_id, num_computed=None) -> None:  # no prefix cache: nothing to forget past num_computed
        for block in reversed(self.tables.pop(seq_id)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free_blocks.append(block)
        del self.tokens[seq_id]

    def undo_admission(self, seq_id, num_computed) -> None:  # no prefix cache: no lookups counted
        self.free(seq_id, num_computed)

    def has_seq(self, seq_id) -> bool:
        return seq_id in self.tables

    def block_table(self, seq_id) -> list[int]:
        return list(self.tables[seq_id])

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)


class FakeSwap:
    """Records what was saved; restore hands back the saved token count."""

    def __init__(self) -> None:
        self.saved: dict[int, tuple[list[int], int]] = {}
        self.restored: list[tuple[int, list[int]]] = []

    def __contains__(self, seq_id) -> bool:
        return seq_id in self.saved

    def __len__(self) -> int:
        return len(self.saved)

    @property
    def tokens_held(self) -> int:
        return sum(num_tokens for _, num_tokens in self.saved.values())

    def save(self, seq_id, blocks, num_tokens) -> None:
        self.saved[seq_id] = (list(blocks), num_tokens)

    def restore(self, seq_id, blocks) -> None:
        del self.saved[seq_id]
        self.restored.append((seq_id, list(blocks)))

    def drop(self, seq_id) -> None:
        self.saved.pop(seq_id, None)
