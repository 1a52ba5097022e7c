import pytest

from pagedllm.errors import InvalidInputError
from pagedllm.kv.contiguous import ContiguousAllocator
from pagedllm.kv.manager import KVCacheManager


def _fill_four(alloc: ContiguousAllocator) -> None:
    for i in range(4):  # four adjacent runs of 4 slots: [0,4) [4,8) [8,12) [12,16)
        assert alloc.allocate(f"s{i}", 2, 2) is not None
    alloc.check_invariants()


def test_first_fit_places_runs_adjacently_and_views_them():
    alloc = ContiguousAllocator(16, max_len=16, policy="exact")
    a = alloc.allocate("a", 3, 5, final_len=5)
    b = alloc.allocate("b", 2, 2)
    assert (a.start, a.reserved, a.used, a.final_len) == (0, 8, 3, 5)
    assert (b.start, b.reserved, b.used) == (8, 4, 2)
    assert alloc.free_runs() == [(12, 4)]
    alloc.check_invariants()


def test_max_len_policy_reserves_the_model_maximum():
    alloc = ContiguousAllocator(64, max_len=32, policy="max_len")
    assert alloc.allocate("a", 3, 2).reserved == 32
    assert alloc.allocate("b", 1, 1).reserved == 32
    assert alloc.allocate("c", 1, 1) is None


def test_refuses_although_total_free_suffices_while_paged_admits():
    alloc = ContiguousAllocator(16, max_len=16, policy="exact")
    _fill_four(alloc)
    alloc.free("s0")
    alloc.free("s2")
    assert alloc.num_free_slots == 8 and alloc.largest_free_run == 4
    assert alloc.allocate("x", 2, 4) is None  # needs one run of 6
    alloc.check_invariants()

    paged = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    for i in range(4):
        assert paged.allocate(f"s{i}", range(4), 4) is not None
    paged.free("s0")
    paged.free("s2")
    assert paged.allocate("x", range(6), 6) is not None
    assert sorted(paged.block_table("x")) == [0, 2]  # two non-adjacent blocks serve one request
    paged.check_invariants()


def test_free_coalesces_neighbours():
    alloc = ContiguousAllocator(16, max_len=16, policy="exact")
    _fill_four(alloc)
    alloc.free("s1")
    alloc.free("s3")
    assert alloc.free_runs() == [(4, 4), (12, 4)]
    alloc.free("s2")  # joins both neighbours
    assert alloc.free_runs() == [(4, 12)]
    assert alloc.allocate("big", 2, 10).start == 4
    alloc.check_invariants()


def test_append_stops_at_the_end_of_the_reservation():
    alloc = ContiguousAllocator(8, max_len=8, policy="exact")
    alloc.allocate("a", 2, 2)
    assert alloc.append("a") and alloc.append("a")
    assert not alloc.can_append("a")
    assert not alloc.append("a")
    assert alloc.reservation("a").used == 4


def test_exact_reservation_is_capped_at_max_len_and_prompt_must_fit():
    alloc = ContiguousAllocator(64, max_len=10, policy="exact")
    assert alloc.reservation_size(4, 100) == 10


def test_double_allocate_is_a_bug():
    alloc = ContiguousAllocator(8, max_len=8)
    alloc.allocate("a", 1, 1)
    with pytest.raises(ValueError):
        alloc.allocate("a", 1, 1)


@pytest.mark.parametrize("kwargs", [dict(num_slots=0, max_len=4), dict(num_slots=8, max_len=-1),
                                    dict(num_slots=8, max_len=4, policy="pow2")])
def test_bad_construction_is_a_user_error(kwargs):
    with pytest.raises(InvalidInputError):
        ContiguousAllocator(**kwargs)


def test_append_of_several_tokens_uses_that_many_slots():
    alloc = ContiguousAllocator(16, 8, "max_len")
    alloc.allocate("a", 3, 5)
    assert alloc.append("a", 4) and alloc.reservation("a").used == 7
    assert not alloc.append("a", 2) and alloc.reservation("a").used == 7  # 9 > 8: refused, unchanged
    assert alloc.append("a", 1) and alloc.reservation("a").used == 8


def test_reservations_are_listed_by_start_after_a_hole_is_reused():
    alloc = ContiguousAllocator(24, 8, "max_len")
    for seq in "abc":
        alloc.allocate(seq, 1, 1)
    alloc.free("a")
    alloc.allocate("d", 1, 1)  # first fit: the hole at 0
    assert [(r.seq_id, r.start) for r in alloc.reservations()] == [("d", 0), ("b", 8), ("c", 16)]


def test_a_full_pool_has_no_free_run():
    alloc = ContiguousAllocator(16, 8, "max_len")
    alloc.allocate("a", 1, 1)
    alloc.allocate("b", 1, 1)
    assert alloc.free_runs() == [] and alloc.largest_free_run == 0 and alloc.num_free_slots == 0


def test_check_invariants_catches_uncoalesced_free_runs():
    alloc = ContiguousAllocator(16, 8, "max_len")
    alloc._free = [[0, 8], [8, 8]]  # the same slots, split: first fit would refuse a 16-slot run
    with pytest.raises(AssertionError, match="not coalesced"):
        alloc.check_invariants()
