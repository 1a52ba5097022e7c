import subprocess
import sys

import pytest

import pagedllm.kv.prefix as prefix
from pagedllm.errors import InvalidInputError
from pagedllm.kv.manager import KVCacheManager
from pagedllm.kv.prefix import ROOT, block_keys, hash_block, make_key

EXPECTED_ROOT = "2338ef38c4723542ea53a25b624cef0a2cb646a47dbdce960321a9ccee6417c1"
EXPECTED_1234 = "43a52a0a3607971d7744ef07ba3d5e2e449f40b1f19fd91d20f571efe5209532"


def test_hash_is_a_fixed_value():
    assert ROOT.hex() == EXPECTED_ROOT
    assert hash_block(ROOT, [1, 2, 3, 4]).hex() == EXPECTED_1234


def test_hash_is_stable_across_processes():
    code = ("from pagedllm.kv.prefix import ROOT, hash_block;"
            "print(hash_block(ROOT, [1, 2, 3, 4], ('m', None, 7)).hex())")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2")}
    assert runs == {hash_block(ROOT, [1, 2, 3, 4], ("m", None, 7)).hex()}


def test_chain_depends_on_parent_tokens_and_extras():
    a = block_keys([1, 2, 3, 4, 5, 6], 3)
    b = block_keys([9, 9, 9, 4, 5, 6], 3)
    assert a[1].token_ids == b[1].token_ids
    assert a[1].digest != b[1].digest
    assert a[1].parent == a[0].digest
    assert make_key(ROOT, [1], ("x",)).digest != make_key(ROOT, [1], ("y",)).digest
    assert make_key(ROOT, [1], ("a", "b")).digest != make_key(ROOT, [1], ("ab",)).digest
    assert make_key(ROOT, [1], (1,)).digest != make_key(ROOT, [1], ("1",)).digest


def test_only_full_blocks_get_keys():
    assert len(block_keys(list(range(7)), 4)) == 1
    assert block_keys(list(range(7)), 4, max_blocks=0) == []


def test_unsupported_extra_key_is_refused():
    with pytest.raises(InvalidInputError, match="extra key"):
        make_key(ROOT, [1], ({"a": 1},))


def _cached(m, seq, tokens, extra=()):
    m.allocate(seq, tokens, len(tokens), extra_keys=extra)
    m.free(seq)


def test_same_tokens_after_another_prefix_never_match():
    m = KVCacheManager(8, 4)
    _cached(m, "a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    hit = m.lookup_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0])
    assert hit.blocks == [] and hit.num_tokens == 0
    assert m.lookup_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0]).num_tokens == 8


def test_different_extra_keys_never_match():
    m = KVCacheManager(8, 4)
    _cached(m, "a", list(range(9)), extra=("model-a", "salt1"))
    assert m.lookup_prefix(list(range(9)), ("model-b", "salt1")).blocks == []
    assert m.lookup_prefix(list(range(9)), ("model-a", "salt2")).blocks == []
    assert m.lookup_prefix(list(range(9))).blocks == []
    assert len(m.lookup_prefix(list(range(9)), ("model-a", "salt1")).blocks) == 2


def test_forced_collision_never_returns_another_requests_blocks(monkeypatch):
    monkeypatch.setattr(prefix, "hash_block", lambda parent, tokens, extra=(): b"\x00" * 32)
    m = KVCacheManager(8, 4)
    m.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8, 9], 9)
    assert m.lookup_prefix([5, 5, 5, 5, 5, 5, 5, 5, 5]).blocks == []
    assert m.lookup_prefix([1, 2, 3, 4, 1, 2, 3, 4, 9]).blocks == [0]  # block 1 collides with block 0: miss
    assert m.lookup_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9]).blocks == [0]  # block 1 never got the taken digest
    m.free("a")
    assert m.lookup_prefix([1, 2, 3, 4, 9], ("other",)).blocks == []
    m.check_invariants()
