import pytest

from pagedllm.errors import InvalidInputError
from pagedllm.kv.block_pool import BlockPool, OutOfBlocksError
from pagedllm.kv.prefix import ROOT, make_key


def ids(blocks):
    return [b.block_id for b in blocks]


def queue(pool):
    return [b.block_id for b in pool.free_queue]


@pytest.mark.parametrize("num_blocks,block_size", [(0, 4), (-1, 4), (4, 0), (4, -2), (2.5, 4)])
def test_invalid_sizes_are_rejected(num_blocks, block_size):
    with pytest.raises(InvalidInputError, match="must be a positive integer"):
        BlockPool(num_blocks, block_size)


def test_initial_queue_is_ids_in_order():
    pool = BlockPool(5, 4)
    assert queue(pool) == [0, 1, 2, 3, 4]
    assert pool.num_free_blocks == 5


def test_allocate_free_reallocate_order():
    pool = BlockPool(4, 4)
    a = pool.get_new_blocks(3)
    assert ids(a) == [0, 1, 2]
    assert all(b.ref_cnt == 1 for b in a)
    pool.free_blocks(reversed(a))  # tail first
    assert queue(pool) == [3, 2, 1, 0]
    assert ids(pool.get_new_blocks(2)) == [3, 2]
    assert queue(pool) == [1, 0]


def test_eviction_is_lru_and_drops_the_hash():
    pool = BlockPool(4, 2)
    blocks = pool.get_new_blocks(4)
    keys = [make_key(ROOT, [i, i], ()) for i in range(4)]
    for b, k in zip(blocks, keys):
        assert pool.cache_full_block(b, k)
    pool.free_blocks([blocks[2], blocks[0], blocks[3], blocks[1]])
    assert queue(pool) == [2, 0, 3, 1]
    assert pool.num_cached_free_blocks == 4
    (evicted,) = pool.get_new_blocks(1)
    assert evicted.block_id == 2
    assert evicted.block_hash is None
    assert pool.get_cached_block(keys[2]) is None
    assert pool.get_cached_block(keys[0]) is blocks[0]
    assert pool.num_cached_free_blocks == 3


def test_cache_hit_removes_block_from_middle_of_queue():
    pool = BlockPool(4, 2)
    blocks = pool.get_new_blocks(4)
    key = make_key(ROOT, [7, 7], ())
    pool.cache_full_block(blocks[1], key)
    pool.free_blocks(blocks)
    assert queue(pool) == [0, 1, 2, 3]
    hit = pool.get_cached_block(key)
    pool.touch([hit])
    assert hit.ref_cnt == 1 and hit.block_hash == key
    assert queue(pool) == [0, 2, 3]
    assert ids(pool.get_new_blocks(3)) == [0, 2, 3]
    assert pool.get_cached_block(key) is blocks[1]


def test_touch_used_block_only_counts():
    pool = BlockPool(2, 2)
    (b,) = pool.get_new_blocks(1)
    pool.touch([b])
    assert b.ref_cnt == 2 and queue(pool) == [1]
    pool.free_blocks([b])
    assert b.ref_cnt == 1 and queue(pool) == [1]
    pool.free_blocks([b])
    assert queue(pool) == [1, 0]


def test_over_asking_raises_and_double_free_raises():
    pool = BlockPool(2, 2)
    with pytest.raises(OutOfBlocksError):
        pool.get_new_blocks(3)
    assert queue(pool) == [0, 1]
    (b,) = pool.get_new_blocks(1)
    pool.free_blocks([b])
    with pytest.raises(RuntimeError, match="ref_cnt 0"):
        pool.free_blocks([b])


def test_one_block_per_digest():
    pool = BlockPool(3, 2)
    a, b, _ = pool.get_new_blocks(3)
    key = make_key(ROOT, [1, 2], ())
    assert pool.cache_full_block(a, key)
    assert not pool.cache_full_block(b, key)  # duplicate: b stays uncached
    assert b.block_hash is None
    assert not pool.cache_full_block(a, make_key(ROOT, [3, 4], ()))  # a keeps its first key
    assert pool.get_cached_block(key) is a


def test_reset_prefix_cache_refused_while_a_hashed_block_is_used():
    pool = BlockPool(2, 2)
    a, b = pool.get_new_blocks(2)
    key = make_key(ROOT, [1, 2], ())
    pool.cache_full_block(a, key)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(key) is a
    pool.free_blocks([a, b])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(key) is None and a.block_hash is None
    assert pool.num_cached_free_blocks == 0
