import pytest

from pagedllm.errors import InvalidInputError
from pagedllm.kv.manager import Allocation, InvariantError, KVCacheManager, PrefixHit


def queue(m):
    return [b.block_id for b in m.pool.free_queue]


def state(m):
    return m.snapshot(), m.stats(), queue(m)


def test_exact_block_orders_through_allocate_free_hit_evict():
    m = KVCacheManager(4, 2)
    assert m.allocate("a", [1, 2, 3, 4, 5, 6], 6) == Allocation([0, 1, 2], [])
    m.free("a")
    assert queue(m) == [3, 2, 1, 0]  # tail first: the prefix block 0 is evicted last
    assert m.num_cached_blocks == 3
    hit = m.lookup_prefix([1, 2, 3, 4, 7])
    assert hit == PrefixHit([0, 1], 4)
    assert m.allocate("b", [1, 2, 3, 4, 7], 1, hit) == Allocation([3], [])
    assert queue(m) == [2]  # 1 and 0 left the middle / end of the queue
    assert m.block_table("b") == [0, 1, 3]
    assert m.allocate("c", [8, 8], 2) == Allocation([2], [])  # evicts the LRU cached block 2
    assert m.lookup_prefix([1, 2, 3, 4, 5, 6, 0]).blocks == [0, 1]
    m.check_invariants()
    m.free("b")
    assert queue(m) == [3, 1, 0]
    m.free("c")
    assert queue(m) == [3, 1, 0, 2]
    assert m.num_used_blocks == 0
    m.check_invariants()


def test_blocks_past_the_computed_positions_lose_their_hash_when_freed():
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3, 4, 5, 6], 4)  # computed by a step
    m.allocate("a", [1, 2, 3, 4, 5, 6], 2)  # the next step's block, hashed as allocated; that step never runs
    m.free("a", num_computed=4)
    assert m.lookup_prefix([1, 2, 3, 4, 5, 6, 7]) == PrefixHit([0, 1], 4)  # not the block never written
    assert m.num_cached_blocks == 2
    m.check_invariants()
    m.allocate("b", [7, 8, 9, 9], 2)
    m.fork("b", "c")  # a block others still hold keeps its hash
    m.free("b", num_computed=0)
    assert m.lookup_prefix([7, 8, 1]) == PrefixHit(m.block_table("c"), 2)
    m.check_invariants()


def test_cache_hit_takes_a_block_from_the_middle_of_the_queue():
    m = KVCacheManager(6, 2)
    m.allocate("a", [1, 2, 3, 4], 4)
    m.allocate("b", [5, 6, 7, 8], 4)
    m.free("a")
    m.free("b")
    assert queue(m) == [4, 5, 1, 0, 3, 2]
    hit = m.lookup_prefix([5, 6, 0])
    assert hit.blocks == [2]
    m.allocate("c", [5, 6, 0], 1, hit)
    assert queue(m) == [5, 1, 0, 3]
    assert m.block_table("c") == [2, 4]
    m.check_invariants()


def test_new_block_only_when_tail_is_full():
    m = KVCacheManager(4, 4)
    toks = list(range(10))
    assert m.allocate("s", toks, 3).new_blocks == [0]
    assert m.allocate("s", toks, 1).new_blocks == []
    assert m.allocate("s", toks, 1).new_blocks == [1]
    assert m.num_tokens("s") == 5 and m.block_table("s") == [0, 1]
    assert m.allocate("s", toks, 0) == Allocation([], [])
    m.check_invariants()


def test_seed_ten_tokens_take_three_blocks_with_two_empty_slots():
    m = KVCacheManager(8, 4)
    m.allocate("s", list(range(10)), 10)
    assert len(m.block_table("s")) == 3
    assert m.stats().tokens_stored == 10
    assert [i.filled for i in m.snapshot()[:3]] == [4, 4, 2]
    assert m.slot_mapping("s", 8, 10) == [2 * 4 + 0, 2 * 4 + 1]


def test_lookup_never_covers_the_last_prompt_token():
    m = KVCacheManager(8, 4)
    m.allocate("a", list(range(8)), 8)
    assert m.lookup_prefix(list(range(8))).num_tokens == 4
    assert m.lookup_prefix(list(range(9))).num_tokens == 8
    assert m.lookup_prefix([]).num_tokens == 0
    assert m.lookup_prefix([0]).num_tokens == 0


def test_lookup_is_pure():
    m = KVCacheManager(8, 4)
    m.allocate("a", list(range(9)), 9)
    m.free("a")
    before = state(m)
    m.lookup_prefix(list(range(9)))
    assert state(m) == before


def test_prefix_caching_off():
    m = KVCacheManager(8, 4, enable_prefix_caching=False)
    m.allocate("a", list(range(9)), 9)
    m.free("a")
    assert m.lookup_prefix(list(range(9))) == PrefixHit([], 0)
    assert m.num_cached_blocks == 0
    with pytest.raises(InvalidInputError, match="disabled"):
        m.allocate("b", list(range(9)), 1, PrefixHit([0], 4))
    m.check_invariants()


def test_blocks_fill_incrementally_while_decoding():
    m = KVCacheManager(8, 4)
    toks = [7, 7, 7]
    m.allocate("a", toks, 3)
    assert m.lookup_prefix([7, 7, 7, 7, 1]).blocks == []
    toks.append(7)
    m.allocate("a", toks, 1)
    assert m.lookup_prefix([7, 7, 7, 7, 1]).blocks == [0]
    m.check_invariants()


def test_extra_keys_are_remembered_from_creation():
    m = KVCacheManager(8, 2)
    m.allocate("a", [1, 2, 3], 3, extra_keys=("lora-1",))
    m.allocate("a", [1, 2, 3, 4], 1, extra_keys=("ignored",))
    assert m.lookup_prefix([1, 2, 3, 4, 5], ("lora-1",)).blocks == [0, 1]
    assert m.lookup_prefix([1, 2, 3, 4, 5], ("ignored",)).blocks == []


def test_fork_then_append_into_partial_tail_copies_on_write():
    m = KVCacheManager(8, 4)
    toks = list(range(6))
    m.allocate("p", toks, 6)
    m.fork("p", "c")
    assert m.block_table("c") == [0, 1] and m.num_tokens("c") == 6
    assert [i.ref_cnt for i in m.snapshot()[:2]] == [2, 2]
    alloc = m.allocate("c", toks + [99], 1)
    assert alloc == Allocation([2], [(1, 2)])
    assert m.block_table("c") == [0, 2]
    assert m.block_table("p") == [0, 1]
    assert [i.ref_cnt for i in m.snapshot()[:3]] == [2, 1, 1]
    # the second writer now owns block 1 alone and writes in place
    assert m.allocate("p", toks + [42], 1) == Allocation([], [])
    assert m.block_table("p") == [0, 1]
    m.check_invariants()


def test_full_shared_blocks_are_not_copied():
    m = KVCacheManager(8, 4)
    toks = list(range(8))
    m.allocate("p", toks, 8)
    m.fork("p", "c")
    assert m.allocate("c", toks + [1], 1) == Allocation([2], [])
    assert m.allocate("p", toks + [2], 1) == Allocation([3], [])
    assert m.block_table("c") == [0, 1, 2] and m.block_table("p") == [0, 1, 3]
    m.check_invariants()


def test_fork_shares_hashes_so_children_fill_blocks_that_get_cached():
    m = KVCacheManager(8, 2)
    m.allocate("p", [1, 2, 3], 3)
    m.fork("p", "c")
    m.allocate("c", [1, 2, 3, 4], 1)
    assert m.lookup_prefix([1, 2, 3, 4, 0]).blocks == [0, 2]
    m.free("p")
    m.free("c")
    assert m.num_used_blocks == 0
    m.check_invariants()


def test_no_fit_returns_none_without_mutation():
    m = KVCacheManager(3, 2)
    m.allocate("a", [1, 2, 3, 4, 5], 5)
    m.free("a")
    hit = m.lookup_prefix([1, 2, 3, 4, 9, 9, 9])
    assert hit.blocks == [0, 1]
    # adopting two free cached blocks consumes them: 2 + 2 new > 3 free
    before = state(m)
    assert m.allocate("b", [1, 2, 3, 4, 9, 9, 9], 3, hit) is None
    assert state(m) == before and not m.has_seq("b")
    assert m.allocate("b", [1, 2, 3, 4, 9, 9, 9], 2, hit) == Allocation([2], [])  # 2 adopted + 1 new = 3
    m.check_invariants()


def test_cow_needs_one_extra_block():
    m = KVCacheManager(2, 2)
    m.allocate("p", [1, 2, 3], 3)
    m.fork("p", "c")
    assert m.num_free_blocks == 0
    before = state(m)
    assert m.allocate("c", [1, 2, 3, 4], 1) is None
    assert state(m) == before
    m.free("p")
    assert m.allocate("c", [1, 2, 3, 4], 1) == Allocation([], [])  # tail no longer shared: written in place


def test_stats_and_snapshot():
    m = KVCacheManager(6, 2)
    m.allocate("a", [1, 2, 3, 4, 5], 5)
    m.fork("a", "b")
    m.free("a")
    hit = m.lookup_prefix([1, 2, 3, 4, 5])
    m.allocate("c", [1, 2, 3, 4, 5], 1, hit)
    m.allocate("d", [8, 8, 8], 3)
    m.free("d")
    s = m.stats()
    assert (s.used, s.free, s.cached_free, s.num_seqs) == (4, 2, 1, 2)
    assert s.tokens_stored == 2 + 2 + 1 + 1  # blocks 0, 1 shared and counted once
    assert (s.prefix_queries_tokens, s.prefix_hits_tokens) == (5 + 5 + 3, 4)
    snap = m.snapshot()
    assert [i.state for i in snap] == ["used", "used", "used", "used", "cached", "free"]
    assert snap[0].owners == ["b", "c"] and snap[0].ref_cnt == 2 and snap[0].cached
    assert snap[2].owners == ["b"] and snap[3].owners == ["c"] and not snap[2].cached
    assert snap[4].filled == 2 and snap[5].filled == 0 and snap[4].owners == []


def test_reset_prefix_cache():
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3], 3)
    assert m.reset_prefix_cache() is False
    assert m.lookup_prefix([1, 2, 3]).blocks == [0]
    m.free("a")
    assert m.reset_prefix_cache() is True
    assert m.lookup_prefix([1, 2, 3]).blocks == []
    assert m.num_cached_blocks == 0
    m.check_invariants()


def test_bad_inputs_are_user_facing_errors():
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3], 3)
    with pytest.raises(InvalidInputError, match=">= 0"):
        m.allocate("a", [1, 2, 3], -1)
    with pytest.raises(InvalidInputError, match="unknown sequence 'zz'"):
        m.fork("zz", "b")
    with pytest.raises(InvalidInputError, match="already exists"):
        m.fork("a", "a")
    with pytest.raises(InvalidInputError, match="unknown sequence"):
        m.free("zz")
    with pytest.raises(InvalidInputError, match="token_ids has 3 tokens"):
        m.allocate("a", [1, 2, 3], 1)
    with pytest.raises(InvalidInputError, match="token_ids has 1 tokens"):
        m.allocate("new", [1], 2)
    with pytest.raises(InvalidInputError, match="claims"):
        m.allocate("new", [1, 2, 3], 1, PrefixHit([0], 4))
    with pytest.raises(InvalidInputError, match="unknown sequence"):
        m.block_table("zz")
    with pytest.raises(InvalidInputError):
        KVCacheManager(0, 2)
    assert m.block_table("a") == [0, 1] and not m.has_seq("new")
    m.check_invariants()


def test_stale_prefix_hit_returns_none_without_mutation():
    m = KVCacheManager(2, 2)
    m.allocate("a", [1, 2, 3], 3)
    m.free("a")
    hit = m.lookup_prefix([1, 2, 3])
    assert hit.blocks == [0]
    m.allocate("b", [5, 5, 5, 5], 4)  # evicts block 0
    m.free("b")
    before = state(m)
    assert m.allocate("c", [1, 2, 3], 1, hit) is None
    assert m.allocate("c", [9, 9, 3], 1, hit) is None  # a hit for other tokens is refused the same way
    assert state(m) == before and not m.has_seq("c")
    with pytest.raises(InvalidInputError, match="outside the pool"):
        m.allocate("c", [1, 2, 3], 1, PrefixHit([7], 2))
    with pytest.raises(InvalidInputError, match="outside the pool"):
        m.allocate("c", [1, 2, 3], 1, PrefixHit([-1], 2))
    with pytest.raises(InvalidInputError, match="outside the pool"):
        m.allocate("c", [1, 2, 3], 1, PrefixHit([m.num_blocks], 2))  # one past the last block
    assert m.lookup_prefix([5, 5, 5, 5, 1]).blocks == [1, 0]
    fresh = m.lookup_prefix([5, 5, 1])
    assert fresh.blocks == [1] and m.allocate("c", [5, 5, 1], 1, fresh) == Allocation([0], [])
    m.check_invariants()


def test_sibling_admission_can_evict_a_planned_hit():
    m = KVCacheManager(3, 2)
    m.allocate("a", [1, 2, 3], 3)
    m.free("a")
    hit_y = m.lookup_prefix([1, 2, 3])
    m.allocate("x", [4, 4, 4, 4, 4, 4], 6)  # pops all three free blocks, evicting block 0
    m.free("x")
    assert m.allocate("y", [1, 2, 3], 1, hit_y) is None


def test_check_invariants_names_the_broken_invariant():
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3], 3)
    m.pool.blocks[0].ref_cnt = 2
    with pytest.raises(InvariantError, match="tables containing it"):
        m.check_invariants()
    m.pool.blocks[0].ref_cnt = 1
    m.check_invariants()
    m._seqs["a"].table.num_tokens = 5
    with pytest.raises(InvariantError, match="ceil"):
        m.check_invariants()
    m._seqs["a"].table.num_tokens = 3
    m.pool.free_queue.head.next.prev = None
    with pytest.raises(InvariantError, match="free queue link"):
        m.check_invariants()


def test_check_invariants_catches_a_hash_map_mismatch():
    m = KVCacheManager(4, 2)
    m.allocate("a", [1, 2, 3], 3)
    m.pool.blocks[1].block_hash = m.pool.blocks[0].block_hash
    with pytest.raises(InvariantError):
        m.check_invariants()


def test_undoing_an_admission_takes_its_lookup_back_from_the_counters():
    m = KVCacheManager(6, 2)
    m.allocate("a", [1, 2, 3, 4, 5], 5)
    m.free("a")
    before = m.stats()
    hit = m.lookup_prefix([1, 2, 3, 4, 9])
    m.allocate("b", [1, 2, 3, 4, 9], 1, hit)
    assert m.stats().prefix_hits_tokens == before.prefix_hits_tokens + 4
    m.undo_admission("b", 4)
    after = m.stats()
    m.check_invariants()
    assert (after.prefix_queries_tokens, after.prefix_hits_tokens, after.used) == (
        before.prefix_queries_tokens, before.prefix_hits_tokens, 0)


def test_a_hit_block_recached_under_another_parent_is_stale():
    """Block 1 of the hit is evicted and cached again for the same tokens after another first block: its key's
    parent no longer chains to the hit's block 0, so the hit is refused (guards the parent in key_matches)."""
    m = KVCacheManager(3, 2)
    m.allocate("a", [1, 2, 3, 4, 5], 5)  # blocks 0 [1, 2], 1 [3, 4], 2 [5]
    m.free("a")  # tail first: the free queue is 2, 1, 0
    hit = m.lookup_prefix([1, 2, 3, 4, 5])
    assert hit.blocks == [0, 1]
    m.allocate("x", [9, 9, 3, 4], 4)  # pops 2 and 1: block 1 now holds [3, 4] after [9, 9]
    m.free("x")
    assert m.allocate("y", [1, 2, 3, 4, 5], 1, hit) is None
    m.check_invariants()


def test_a_hit_block_recached_under_another_salt_is_stale():
    """Block 0 of the hit is evicted and cached again for the same tokens with a cache salt: not the hit's
    tenant's, so the hit is refused (guards the extra keys in key_matches)."""
    m = KVCacheManager(2, 2)
    m.allocate("a", [1, 2, 3], 3)  # blocks 0 [1, 2], 1 [3]
    m.free("a")  # the free queue is 1, 0
    hit = m.lookup_prefix([1, 2, 3])
    assert hit.blocks == [0]
    m.allocate("z", [8], 1)  # pops block 1
    m.allocate("x", [1, 2], 2, extra_keys=("salt", "s"))  # pops block 0: [1, 2] under the salt
    m.free("z")
    m.free("x")
    assert m.allocate("y", [1, 2, 3], 1, hit) is None
    m.check_invariants()
