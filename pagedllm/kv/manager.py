"""KVCacheManager: block tables over one BlockPool, with prefix caching and copy-on-write.

Admission is one call: allocate() takes the slots, or returns None without changing anything when they
do not fit (or a prefix hit went stale), so the scheduler can preempt or wait instead.
"""

from dataclasses import dataclass, field
from typing import Literal, Sequence

from pagedllm.errors import InvalidInputError
from pagedllm.kv.block_pool import Block, BlockPool
from pagedllm.kv.block_table import BlockTable, blocks_needed
from pagedllm.kv.ids import BlockId, SeqId
from pagedllm.kv.prefix import ROOT, BlockKey, block_keys, key_matches, make_key


class InvariantError(AssertionError):
    """A memory-system invariant (docs/memory.md, "Invariants") is broken: always a bug, never bad input."""


@dataclass(slots=True)
class PrefixHit:
    blocks: list[BlockId]  # cached full blocks matching the token prefix, in order
    num_tokens: int  # len(blocks) * block_size


@dataclass(slots=True)
class Allocation:
    new_blocks: list[BlockId]  # blocks newly taken from the pool by this call
    copies: list[tuple[BlockId, BlockId]]  # copy-on-write (src, dst) pairs to copy before writing


@dataclass(slots=True)
class KVStats:
    num_blocks: int
    block_size: int
    used: int
    free: int
    cached_free: int
    tokens_stored: int  # sum over distinct used blocks of filled slots
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    num_seqs: int


@dataclass(slots=True)
class BlockInfo:
    block_id: BlockId
    owners: list[SeqId]
    ref_cnt: int
    filled: int
    cached: bool
    state: Literal["free", "cached", "used"]


@dataclass(slots=True)
class _Seq:
    table: BlockTable
    keys: list[BlockKey] = field(default_factory=list)  # keys of the full blocks, in order
    extra_keys: tuple = ()
    counted: tuple[int, int] = (0, 0)  # its first allocation's prefix lookup: tokens queried, tokens hit


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.pool = BlockPool(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._seqs: dict[SeqId, _Seq] = {}
        self._queries_tokens = 0
        self._hits_tokens = 0
        self._unwritten: list[Block] = []  # hashed since the last step ran (step_ran / step_failed)

    # ---- prefix lookup -------------------------------------------------------------------------------

    def lookup_prefix(self, token_ids: Sequence[int], extra_keys: tuple = ()) -> PrefixHit:
        """Longest run of cached full blocks matching token_ids; pure. Never covers the last prompt token,
        so there are always logits to sample from."""
        if not self.enable_prefix_caching:
            return PrefixHit([], 0)
        max_blocks = max(0, (len(token_ids) - 1) // self.block_size)
        blocks: list[BlockId] = []
        parent = ROOT
        for i in range(max_blocks):
            chunk = token_ids[i * self.block_size:(i + 1) * self.block_size]
            block = self.pool.get_cached_block(make_key(parent, chunk, extra_keys))
            if block is None:
                break
            blocks.append(block.block_id)
            parent = block.block_hash.digest
        return PrefixHit(blocks, len(blocks) * self.block_size)

    # ---- admission -----------------------------------------------------------------------------------

    def _blocks_to_take(self, seq_id: SeqId, num_new_tokens: int, prefix: PrefixHit | None) -> int:
        """Free blocks the allocation would consume (including free-but-cached hit blocks it adopts)."""
        seq = self._seqs.get(seq_id)
        if seq is not None:
            table = seq.table
            grow = blocks_needed(table.num_tokens + num_new_tokens, self.block_size) - len(table.blocks)
            return grow + int(self._needs_cow(seq, num_new_tokens))
        prefix = self._check_prefix(prefix)
        adopted_free = sum(1 for b in prefix.blocks if self.pool.blocks[b].ref_cnt == 0)
        total = blocks_needed(prefix.num_tokens + num_new_tokens, self.block_size)
        return adopted_free + total - len(prefix.blocks)

    def _needs_cow(self, seq: _Seq, num_new_tokens: int) -> bool:
        # Invariant: nobody writes into a block whose refcount is above 1.
        table = seq.table
        return (num_new_tokens > 0 and table.tail_is_partial()
                and self.pool.blocks[table.blocks[-1]].ref_cnt > 1)

    def allocate(self, seq_id: SeqId, token_ids: Sequence[int], num_new_tokens: int,
                 prefix: PrefixHit | None = None, extra_keys: tuple = (), count_lookup: bool = True
                 ) -> Allocation | None:
        """Slots for the next num_new_tokens positions of seq_id, or None (nothing changed) if they do not fit
        or the prefix hit went stale (a hit block was evicted since lookup_prefix: look up again). A new
        sequence's lookup counts in the prefix cache's queries and hits where count_lookup (the engine counts a
        request's first admission only, not its swap-ins or readmissions)."""
        self._check_count(num_new_tokens)
        seq = self._seqs.get(seq_id)
        start = seq.table.num_tokens if seq is not None else self._check_prefix(prefix).num_tokens
        if len(token_ids) < start + num_new_tokens:
            raise InvalidInputError(
                f"sequence {seq_id!r}: token_ids has {len(token_ids)} tokens but positions up to "
                f"{start + num_new_tokens - 1} are being allocated")
        if seq is None and not self._prefix_still_valid(prefix, token_ids, extra_keys):
            return None
        if self._blocks_to_take(seq_id, num_new_tokens, prefix) > self.pool.num_free_blocks:
            return None
        if seq is None:
            counted = (len(token_ids), self._check_prefix(prefix).num_tokens)
            return self._allocate_new(seq_id, token_ids, num_new_tokens, prefix, extra_keys,
                                      counted if count_lookup and self.enable_prefix_caching else (0, 0))
        return self._extend(seq, token_ids, num_new_tokens)

    def _allocate_new(self, seq_id: SeqId, token_ids: Sequence[int], num_new_tokens: int,
                      prefix: PrefixHit | None, extra_keys: tuple, counted: tuple[int, int]) -> Allocation:
        prefix = self._check_prefix(prefix)
        hit_blocks = [self.pool.blocks[b] for b in prefix.blocks]
        self.pool.touch(hit_blocks)  # before popping new blocks, so the hit cannot be evicted by them
        seq = _Seq(BlockTable(self.block_size, list(prefix.blocks), prefix.num_tokens),
                   [b.block_hash for b in hit_blocks], tuple(extra_keys), counted)
        self._seqs[seq_id] = seq
        self._queries_tokens += counted[0]
        self._hits_tokens += counted[1]
        return self._extend(seq, token_ids, num_new_tokens)

    def _extend(self, seq: _Seq, token_ids: Sequence[int], num_new_tokens: int) -> Allocation:
        table = seq.table
        cow = self._needs_cow(seq, num_new_tokens)
        grow = blocks_needed(table.num_tokens + num_new_tokens, self.block_size) - len(table.blocks)
        new = self.pool.get_new_blocks(grow + int(cow))
        copies = []
        if cow:
            old = table.replace_tail(new[0].block_id)
            self.pool.free_blocks([self.pool.blocks[old]])  # refcount was > 1, so it stays in use
            copies.append((old, new[0].block_id))
        for block in new[int(cow):]:
            table.append(block.block_id)  # Invariant: tables are append-only except CoW and free
        table.num_tokens += num_new_tokens
        self._cache_full_blocks(seq, token_ids)
        return Allocation([b.block_id for b in new], copies)

    def _cache_full_blocks(self, seq: _Seq, token_ids: Sequence[int]) -> None:
        """Hash blocks that just became full (incrementally: from the last hashed block on)."""
        # Invariant: only full blocks are hashed; the key chains the parent digest, tokens and extra keys.
        if not self.enable_prefix_caching:
            return
        done = len(seq.keys)
        parent = seq.keys[-1].digest if seq.keys else ROOT
        full = seq.table.num_tokens // self.block_size
        for key in block_keys(token_ids, self.block_size, seq.extra_keys, parent, done, full - done):
            seq.keys.append(key)
            block = self.pool.blocks[seq.table.blocks[len(seq.keys) - 1]]
            if self.pool.cache_full_block(block, key):
                self._unwritten.append(block)

    def step_ran(self) -> None:
        """The step that writes the K/V of the blocks allocated for it ran: their hashes hold."""
        self._unwritten.clear()

    def step_failed(self) -> None:
        """The step did not run: blocks hashed for it hold no K/V, so none of them may be found again. (Freeing
        the sequences could not tell: one that hit another's block in the same pass counts it as computed.)"""
        for block in self._unwritten:
            self.pool.uncache(block)
        self._unwritten.clear()

    # ---- fork / free ---------------------------------------------------------------------------------

    def fork(self, parent: SeqId, child: SeqId) -> None:
        """The child shares every parent block; the first writer into a shared partial tail copies it."""
        src = self._get(parent)
        if child in self._seqs:
            raise InvalidInputError(f"cannot fork onto {child!r}: that sequence already exists")
        self.pool.touch(self.pool.blocks[b] for b in src.table.blocks)
        self._seqs[child] = _Seq(src.table.copy(), list(src.keys), src.extra_keys)

    def free(self, seq_id: SeqId, num_computed: int | None = None) -> None:
        """Give back every block, tail first, so a prefix outlives its suffix in the LRU queue. num_computed: how
        many of its positions hold K/V (None: all it was given). A full block is hashed when it is allocated, so
        that a prompt admitted in the same step can hit it; one past num_computed (a sequence preempted in the
        pass that allocated it, or a step that failed) loses its hash, or a later hit would read what was never
        written."""
        seq = self._get(seq_id)
        if num_computed is not None:
            for block_id in seq.table.blocks[num_computed // self.block_size : len(seq.keys)]:
                block = self.pool.blocks[block_id]
                if block.ref_cnt == 1:  # a block others hold is theirs to keep
                    self.pool.uncache(block)
        self.pool.free_blocks(self.pool.blocks[b] for b in reversed(seq.table.blocks))
        del self._seqs[seq_id]

    def undo_admission(self, seq_id: SeqId, num_computed: int) -> None:
        """free() a sequence just allocated for a request that could not be admitted whole: its prefix lookup is
        taken back from the counters too (the admission is tried again, and counted, in a later step)."""
        queried, hit = self._get(seq_id).counted
        self._queries_tokens -= queried
        self._hits_tokens -= hit
        self.free(seq_id, num_computed)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # ---- queries -------------------------------------------------------------------------------------

    def has_seq(self, seq_id: SeqId) -> bool:
        return seq_id in self._seqs

    def block_table(self, seq_id: SeqId) -> list[BlockId]:
        return list(self._get(seq_id).table.blocks)

    def num_tokens(self, seq_id: SeqId) -> int:
        return self._get(seq_id).table.num_tokens

    def slot_mapping(self, seq_id: SeqId, start: int, end: int) -> list[int]:
        """Flat slots (block_id * B + offset) of positions [start, end) of seq_id."""
        return self._get(seq_id).table.slot_mapping(start, end)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.pool.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.pool.num_cached_free_blocks

    def _filled(self) -> dict[BlockId, int]:
        filled: dict[BlockId, int] = {}
        for seq in self._seqs.values():
            for i, b in enumerate(seq.table.blocks):
                filled[b] = max(filled.get(b, 0), seq.table.filled(i))
        return filled

    def _tokens_stored(self) -> int:
        """sum(self._filled().values()) without a pass in Python over every block (stats run every step): a
        sequence's blocks before its tail are full, so only tails are counted one by one."""
        full: set[BlockId] = set()
        tails: dict[BlockId, int] = {}
        for seq in self._seqs.values():
            table = seq.table
            num_full = min(len(table.blocks), table.num_tokens // self.block_size)
            full.update(table.blocks[:num_full])
            for i in range(num_full, len(table.blocks)):
                block = table.blocks[i]
                tails[block] = max(tails.get(block, 0), table.filled(i))
        return self.block_size * len(full) + sum(n for block, n in tails.items() if block not in full)

    def stats(self) -> KVStats:
        return KVStats(self.num_blocks, self.block_size, self.num_used_blocks, self.num_free_blocks,
                       self.num_cached_blocks, self._tokens_stored(), self._queries_tokens,
                       self._hits_tokens, len(self._seqs))

    def snapshot(self, start: int = 0, stop: int | None = None) -> list[BlockInfo]:
        """Blocks [start, stop) of the pool, each with its owners and filled slots."""
        owners: dict[BlockId, list[SeqId]] = {}
        for sid, seq in self._seqs.items():
            for b in seq.table.blocks:
                owners.setdefault(b, []).append(sid)
        filled = self._filled()
        return [self._block_info(b, owners.get(b.block_id, []), filled) for b in self.pool.blocks[start:stop]]

    def tables(self) -> dict[SeqId, list[BlockId]]:
        """Every sequence's block table."""
        return {sid: list(seq.table.blocks) for sid, seq in self._seqs.items()}

    def _block_info(self, block: Block, owners: list[SeqId], filled: dict[BlockId, int]) -> BlockInfo:
        cached = block.block_hash is not None
        state = "used" if block.ref_cnt > 0 else ("cached" if cached else "free")
        slots = filled.get(block.block_id, self.block_size if cached else 0)
        return BlockInfo(block.block_id, owners, block.ref_cnt, slots, cached, state)

    # ---- input checks --------------------------------------------------------------------------------

    def _get(self, seq_id: SeqId) -> _Seq:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise InvalidInputError(f"unknown sequence {seq_id!r}")
        return seq

    @staticmethod
    def _check_count(num_new_tokens: int) -> None:
        if num_new_tokens < 0:
            raise InvalidInputError(f"num_new_tokens must be >= 0, got {num_new_tokens}")

    def _check_prefix(self, prefix: PrefixHit | None) -> PrefixHit:
        if prefix is None:
            return PrefixHit([], 0)
        if prefix.blocks and not self.enable_prefix_caching:
            raise InvalidInputError("a prefix hit was passed but prefix caching is disabled")
        if any(not 0 <= b < self.num_blocks for b in prefix.blocks):
            raise InvalidInputError(f"prefix hit names blocks {prefix.blocks}, outside the pool of {self.num_blocks}")
        if prefix.num_tokens != len(prefix.blocks) * self.block_size:
            raise InvalidInputError(f"prefix hit covers {len(prefix.blocks)} blocks but claims "
                                    f"{prefix.num_tokens} tokens (block_size {self.block_size})")
        return prefix

    def _prefix_still_valid(self, prefix: PrefixHit | None, token_ids: Sequence[int], extra_keys: tuple) -> bool:
        """Whether every hit block still holds exactly these tokens. Another allocation between lookup_prefix
        and allocate (e.g. a sibling sequence admitted first) may have evicted one."""
        parent = ROOT
        for i, b in enumerate(self._check_prefix(prefix).blocks):
            key = self.pool.blocks[b].block_hash
            chunk = token_ids[i * self.block_size:(i + 1) * self.block_size]
            if key is None or not key_matches(key, parent, chunk, extra_keys):
                return False
            parent = key.digest
        return True

    # ---- invariants ----------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Check every invariant of docs/memory.md ("Invariants"); raise InvariantError naming the first broken one."""
        in_queue = self._check_free_queue()
        refs = self._check_tables()
        for block in self.pool.blocks:
            _require(block.ref_cnt >= 0, f"block {block.block_id}: negative refcount {block.ref_cnt}")
            # Exactly one state: free (in the queue, refcount 0, cached or not) or in use (refcount >= 1).
            _require((block.ref_cnt == 0) == (block.block_id in in_queue),
                     f"block {block.block_id}: refcount {block.ref_cnt} but in free queue = "
                     f"{block.block_id in in_queue}")
            _require(block.ref_cnt == refs.get(block.block_id, 0),
                     f"block {block.block_id}: refcount {block.ref_cnt} != {refs.get(block.block_id, 0)} "
                     "tables containing it")
        _require(self.num_free_blocks + self.num_used_blocks == self.num_blocks
                 and self.num_used_blocks == len(refs), "free + used != pool size")
        self._check_hashes()

    def _check_free_queue(self) -> set[BlockId]:
        """Links consistent both ways, no cycle, size counter right; returns the ids in the queue."""
        q = self.pool.free_queue
        seen: set[BlockId] = set()
        node = q.head
        while node.next is not q.tail:
            nxt = node.next
            _require(nxt is not None and nxt.prev is node, f"free queue link broken after block {node.block_id}")
            _require(nxt.block_id not in seen and len(seen) < self.num_blocks, "free queue has a cycle")
            seen.add(nxt.block_id)
            node = nxt
        _require(q.tail.prev is node, "free queue tail sentinel link broken")
        _require(len(seen) == q.size, f"free queue holds {len(seen)} blocks but counts {q.size}")
        return seen

    def _check_tables(self) -> dict[BlockId, int]:
        """Each sequence holds ceil(T/B) distinct blocks; returns how many tables contain each block."""
        refs: dict[BlockId, int] = {}
        for sid, seq in self._seqs.items():
            t = seq.table
            _require(len(t.blocks) == blocks_needed(t.num_tokens, self.block_size),
                     f"seq {sid!r}: {t.num_tokens} tokens but {len(t.blocks)} blocks (want ceil(T/B))")
            _require(len(set(t.blocks)) == len(t.blocks), f"seq {sid!r}: a block appears twice in its table")
            want_keys = t.num_tokens // self.block_size if self.enable_prefix_caching else 0
            _require(len(seq.keys) == want_keys, f"seq {sid!r}: {len(seq.keys)} hashed blocks, want {want_keys}")
            parents = [ROOT] + [k.digest for k in seq.keys[:-1]]
            _require(all(k.parent == p for k, p in zip(seq.keys, parents)), f"seq {sid!r}: hash chain broken")
            for b in t.blocks:
                refs[b] = refs.get(b, 0) + 1
        return refs

    def _check_hashes(self) -> None:
        """The digest map and the blocks' keys agree; a hashed block is full in every table holding it."""
        for digest, block in self.pool.cached.items():
            _require(block.block_hash is not None and block.block_hash.digest == digest,
                     f"hash map entry for block {block.block_id} disagrees with the block's hash")
        cached_free = sum(1 for b in self.pool.cached.values() if b.ref_cnt == 0)
        _require(self.pool.num_cached_free_blocks == cached_free,
                 f"cached free blocks counted {self.pool.num_cached_free_blocks}, there are {cached_free}")
        for block in self.pool.blocks:
            if block.block_hash is not None:
                _require(self.pool.cached.get(block.block_hash.digest) is block,
                         f"block {block.block_id} holds a hash missing from the hash map")
        for sid, seq in self._seqs.items():
            for i, b in enumerate(seq.table.blocks):
                key = self.pool.blocks[b].block_hash
                if key is None:
                    continue
                _require(seq.table.filled(i) == self.block_size, f"seq {sid!r}: hashed block {b} is not full")
                _require(seq.keys[i] == key, f"seq {sid!r}: hashed block {b} holds another sequence's tokens")


def _require(ok: bool, invariant: str) -> None:
    if not ok:
        raise InvariantError(invariant)
