import torch

from attn_helpers import make_batch
from pagedllm.attention import allocate_kv_caches, copy_blocks, kv_cache_bytes_per_block, write_kv
from pagedllm.attention.kv_cache import read_tokens, write_tokens
from pagedllm.attention.reference import gather_kv


def test_layout_and_slot_addressing() -> None:
    cache = allocate_kv_caches(2, 5, 4, 3, 8, torch.float32)[0]
    assert cache.shape == (2, 3, 5, 4, 8)  # [2, kvh, num_blocks, block_size, d]
    key = torch.randn(2, 3, 8)
    value = torch.randn(2, 3, 8)
    write_kv(key, value, cache, torch.tensor([9, 2]))  # slot 9 = block 2, offset 1
    assert torch.equal(cache[0, :, 2, 1], key[0]) and torch.equal(cache[1, :, 2, 1], value[0])
    assert torch.equal(cache[0, :, 0, 2], key[1]) and torch.equal(cache[1, :, 0, 2], value[1])
    assert int((cache != 0).sum()) == 2 * 2 * 3 * 8


def test_write_kv_skips_minus_one_slots() -> None:
    cache = allocate_kv_caches(1, 4, 2, 2, 4, torch.float32)[0]
    key = torch.randn(3, 2, 4)
    write_kv(key, key + 1, cache, torch.tensor([-1, 5, -1]))
    flat = cache.view(2, 2, -1, 4)
    assert torch.equal(flat[0, :, 5], key[1]) and torch.equal(flat[1, :, 5], key[1] + 1)
    assert int((cache != 0).sum()) == 2 * 2 * 4  # only slot 5, K and V


def test_write_kv_casts_to_the_cache_dtype() -> None:
    cache = allocate_kv_caches(1, 2, 2, 1, 4, torch.bfloat16)[0]
    key = torch.randn(1, 1, 4)
    write_kv(key, key, cache, torch.tensor([3]))
    assert torch.equal(cache[0, 0, 1, 1], key[0, 0].bfloat16())


def test_copy_blocks_copies_every_layers_k_and_v() -> None:
    caches = allocate_kv_caches(3, 6, 2, 2, 4, torch.float32)
    for cache in caches:
        cache.normal_()
    before = [c.clone() for c in caches]
    copy_blocks(caches, [(1, 4), (3, 0)])
    for cache, old in zip(caches, before):
        assert torch.equal(cache[:, :, 4], old[:, :, 1]) and torch.equal(cache[:, :, 0], old[:, :, 3])
        untouched = [1, 2, 3, 5]
        assert torch.equal(cache[:, :, untouched], old[:, :, untouched])


def test_bytes_per_block() -> None:
    assert kv_cache_bytes_per_block(30, 16, 3, 64, torch.bfloat16) == 2 * 30 * 16 * 3 * 64 * 2


def test_gather_kv_returns_positions_in_order_through_a_shuffled_table() -> None:
    batch = make_batch([(0, 37)], 4, 2, 8, seed=3)
    k, v = gather_kv(batch.kv_cache, batch.meta.block_tables[0], 37)
    assert torch.equal(k, batch.keys[0]) and torch.equal(v, batch.values[0])


def test_read_tokens_and_write_tokens_round_trip() -> None:
    batch = make_batch([(0, 21)], 4, 2, 4, seed=9)
    table = batch.meta.block_tables[0].tolist()
    rows = read_tokens(batch.kv_cache, table, 21)  # [2, tokens, kvh, d]
    assert torch.equal(rows[0], batch.keys[0]) and torch.equal(rows[1], batch.values[0])
    fresh = torch.zeros_like(batch.kv_cache)
    other = [5, 0, 2, 7, 1, 3]  # restore into different physical blocks
    write_tokens(fresh, other, rows)
    assert torch.equal(read_tokens(fresh, other, 21), rows)
