"""Random interleavings of admit / extend / fork / free under memory pressure, with a model of the KV memory:
every slot write is replayed (copies first), and every sequence must read back its own tokens through its
block table after each step. That checks prefix hits and copy-on-write end to end, not only the counters."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pagedllm.kv.manager import KVCacheManager

B = 3
NUM_BLOCKS = 10
BASES = [[1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 3, 3, 2, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 0]]
EXTRAS = [(), ("adapter-1",)]


class KVMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.m = KVCacheManager(NUM_BLOCKS, B)
        self.mem: list[list[int | None]] = [[None] * B for _ in range(NUM_BLOCKS)]
        self.tokens: dict[str, list[int]] = {}
        self.next_id = 0
        self.hits = 0

    def _new_id(self) -> str:
        self.next_id += 1
        return f"s{self.next_id}"

    def _apply(self, sid: str, alloc, start: int, end: int) -> None:
        for src, dst in alloc.copies:
            self.mem[dst] = list(self.mem[src])
        table = self.m.block_table(sid)
        for pos in range(start, end):
            self.mem[table[pos // B]][pos % B] = self.tokens[sid][pos]

    def _ref_cnt(self) -> dict[int, int]:
        return {b.block_id: b.ref_cnt for b in self.m.snapshot()}

    def _adopted_free(self, blocks: list[int]) -> int:
        """Hit blocks that sit free (cached) now: adopting them takes them from the free count."""
        refs = self._ref_cnt()
        return sum(1 for b in blocks if refs[b] == 0)

    def _blocks_to_grow(self, sid: str, start: int, n: int) -> int:
        """New tail blocks for positions [start, start + n), plus one when the partial tail is shared (CoW)."""
        table = self.m.block_table(sid)
        shared_tail = start % B != 0 and n > 0 and self._ref_cnt()[table[-1]] > 1
        return -(-(start + n) // B) - len(table) + int(shared_tail)

    def _allocate_checked(self, wanted: int, sid: str, *args):
        """allocate() is the whole admission API: it takes exactly the free blocks it needs, or nothing."""
        free = self.m.num_free_blocks
        alloc = self.m.allocate(sid, *args)
        assert (alloc is not None) == (wanted <= free), (wanted, free)
        if alloc is not None:
            assert free - self.m.num_free_blocks == wanted
        return alloc

    def _pick(self, index: int) -> str:
        ids = sorted(self.tokens)
        return ids[index % len(ids)]

    @rule(family=st.integers(0, 2), keep=st.integers(0, 9), suffix=st.lists(st.integers(0, 3), max_size=4),
          chunk=st.integers(1, 12), extra=st.sampled_from(EXTRAS))
    def admit(self, family, keep, suffix, chunk, extra):
        prompt = BASES[family][:keep] + suffix
        if not prompt:
            return
        hit = self.m.lookup_prefix(prompt, extra)
        assert hit.num_tokens < len(prompt) and hit.num_tokens == len(hit.blocks) * B
        n = min(chunk, len(prompt) - hit.num_tokens)
        sid = self._new_id()
        wanted = self._adopted_free(hit.blocks) + -(-(hit.num_tokens + n) // B) - len(hit.blocks)
        before = self.m.snapshot()
        alloc = self._allocate_checked(wanted, sid, prompt, n, hit, extra)
        if alloc is None:
            assert self.m.snapshot() == before and not self.m.has_seq(sid)
            return
        self.hits += bool(hit.blocks)
        self.tokens[sid] = prompt
        self._apply(sid, alloc, hit.num_tokens, hit.num_tokens + n)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 100), token=st.integers(0, 3), chunk=st.integers(1, 5))
    def extend(self, index, token, chunk):
        sid = self._pick(index)
        start = self.m.num_tokens(sid)
        if start == len(self.tokens[sid]):
            self.tokens[sid].append(token)  # decode: the sampled token's KV is computed next step
        n = min(chunk, len(self.tokens[sid]) - start)
        before = self.m.snapshot()
        alloc = self._allocate_checked(self._blocks_to_grow(sid, start, n), sid, self.tokens[sid], n)
        if alloc is None:
            assert self.m.snapshot() == before
            return
        assert len(alloc.copies) <= 1
        self._apply(sid, alloc, start, start + n)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 100))
    def fork(self, index):
        parent = self._pick(index)
        child = self._new_id()
        self.m.fork(parent, child)
        self.tokens[child] = self.tokens[parent][: self.m.num_tokens(parent)]

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 100))
    def free(self, index):
        sid = self._pick(index)
        self.m.free(sid)
        del self.tokens[sid]

    @invariant()
    def invariants_hold(self):
        self.m.check_invariants()

    @invariant()
    def tokens_stored_counts_each_blocks_fullest_owner_once(self):
        used = [info for info in self.m.snapshot() if info.state == "used"]
        assert self.m.stats().tokens_stored == sum(info.filled for info in used)

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for sid, toks in self.tokens.items():
            table = self.m.block_table(sid)
            got = [self.mem[table[p // B]][p % B] for p in range(self.m.num_tokens(sid))]
            assert got == toks[: len(got)], sid

    def teardown(self):
        for sid in list(self.tokens):
            self.m.free(sid)
        self.m.check_invariants()
        assert self.m.num_used_blocks == 0 and self.m.num_free_blocks == NUM_BLOCKS
        assert self.m.stats().num_seqs == 0


KVMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestKVMachine = KVMachine.TestCase
