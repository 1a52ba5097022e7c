import pytest

from pagedllm.sim.accounting import MemoryReport, contiguous_report, external_slots, paged_report, split_slack
from pagedllm.kv.contiguous import ContiguousAllocator
from pagedllm.kv.manager import KVCacheManager


def test_seed_reserved_8_used_3_final_5():
    assert split_slack(3, 8, 5) == (2, 3)
    alloc = ContiguousAllocator(8, max_len=8, policy="exact")
    alloc.allocate("a", prompt_len=3, max_tokens=5, final_len=5)
    rep = contiguous_report(alloc)
    assert (rep.tokens, rep.reservation, rep.internal, rep.external, rep.free) == (3, 2, 3, 0, 0)
    rep.check()


def test_unknown_final_length_counts_as_reservation():
    assert split_slack(3, 8, None) == (5, 0)
    assert split_slack(6, 8, 5) == (0, 2)  # past its final length already: nothing still to come


def test_seed_sentence_of_10_contiguous_16_wastes_6_blocks_of_4_waste_2():
    alloc = ContiguousAllocator(16, max_len=16, policy="exact")
    alloc.allocate("a", prompt_len=10, max_tokens=6, final_len=10)
    rep = contiguous_report(alloc)
    assert (rep.tokens, rep.waste, rep.internal) == (10, 6, 6)

    manager = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    manager.allocate("a", range(10), 10)
    rep = paged_report(manager, 4, {"a": 10})
    assert (rep.tokens, rep.waste, rep.internal, rep.free) == (10, 2, 2, 4)
    assert rep.block_occupancy == 12 / 16 and rep.token_occupancy == 10 / 16
    rep.check()


def test_paged_tail_splits_into_reservation_and_internal():
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    manager.allocate("a", range(5), 5)  # 2 blocks, 3 empty tail slots; will end at 7
    rep = paged_report(manager, 4, {"a": 7})
    assert (rep.tokens, rep.reservation, rep.internal, rep.external) == (5, 2, 1, 0)


def test_external_fragmentation_is_measured_against_the_next_request():
    alloc = ContiguousAllocator(16, max_len=16, policy="exact")
    for i in range(4):
        alloc.allocate(f"s{i}", 2, 2, final_len=4)
    alloc.free("s0")
    alloc.free("s2")
    assert contiguous_report(alloc, next_need=6).external == 8
    assert contiguous_report(alloc, next_need=4).external == 0
    assert contiguous_report(alloc, next_need=None).external == 0
    rep = contiguous_report(alloc, next_need=6)
    assert (rep.free, rep.tokens, rep.reservation) == (0, 4, 4)
    rep.check()
    assert external_slots([3, 5, 9], 6) == 8


def test_shared_prefix_blocks_count_once():
    manager = KVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    prompt = list(range(100, 110))
    manager.allocate("a", prompt, 10)
    hit = manager.lookup_prefix(prompt)
    assert hit.num_tokens == 8
    manager.allocate("b", prompt, 2, prefix=hit)
    rep = paged_report(manager, 4, {"a": 12, "b": 10})
    assert rep.tokens == manager.stats().tokens_stored == 12  # 8 shared + 2 + 2 in private tails
    assert (rep.reservation, rep.internal) == (2, 2)
    rep.check()


def test_report_percentages():
    rep = MemoryReport(pool=200, tokens=50, reservation=20, internal=10, external=20, free=100)
    assert rep.waste == 50 and rep.pct(rep.waste) == 25.0 and rep.allocated == 80
    rep.check()


def test_check_rejects_a_negative_category_even_when_the_sum_tiles():
    with pytest.raises(AssertionError, match="do not tile"):
        MemoryReport(pool=10, tokens=12, reservation=-2, internal=0, external=0, free=0).check()
