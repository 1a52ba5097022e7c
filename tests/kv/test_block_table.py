import pytest

from pagedllm.kv.block_table import BlockTable, blocks_needed, empty_tail_slots


def test_seed_ten_tokens_in_blocks_of_four():
    assert blocks_needed(10, 4) == 3
    assert empty_tail_slots(10, 4) == 2


def test_seed_zero_tokens_hold_no_block():
    assert blocks_needed(0, 4) == 0
    assert empty_tail_slots(0, 4) == 0


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_empty_tail_is_between_0_and_b_minus_1(block_size):
    for t in range(100):
        tail = empty_tail_slots(t, block_size)
        assert 0 <= tail <= block_size - 1
        assert blocks_needed(t, block_size) * block_size == t + tail
        assert (blocks_needed(t, block_size) - 1) * block_size < t or t == 0


def test_seed_position_9_with_table_5_1_7():
    table = BlockTable(4, [5, 1, 7], 10)
    assert table.slot(9) == (7, 1)
    assert table.flat_slot(9) == 7 * 4 + 1
    assert table.num_empty_slots == 2


def test_slot_mapping_and_bounds():
    table = BlockTable(4, [5, 1], 6)
    assert table.slot_mapping(2, 6) == [22, 23, 4, 5]
    assert table.filled(0) == 4 and table.filled(1) == 2 and table.filled(2) == 0
    with pytest.raises(IndexError):
        table.slot(8)
    with pytest.raises(IndexError):
        table.slot(-1)


def test_replace_tail_and_copy_are_independent():
    table = BlockTable(4, [3, 8], 5)
    clone = table.copy()
    assert table.replace_tail(9) == 8
    assert table.blocks == [3, 9]
    assert clone.blocks == [3, 8]
