"""Chained block hashes for automatic prefix caching.

The hash of block i is sha256 over a canonical byte encoding of (digest of block i-1 or ROOT, the block's
token ids, the extra keys). It depends only on those values, never on Python's per-process hash(), so it is
stable across processes and machines.
"""

import hashlib
import struct
from dataclasses import dataclass
from typing import Sequence

from pagedllm.errors import InvalidInputError
from pagedllm.kv.ids import BlockHash

ROOT = BlockHash(hashlib.sha256(b"pagedllm.kv.prefix.root.v1").digest())


@dataclass(frozen=True, slots=True)
class BlockKey:
    """The full key of a full block. A cached block stores it, and a lookup compares all of it, not only the
    digest: a sha256 collision then can only miss, never hand out another request's KV. The parent is compared
    as a digest, which is enough because the lookup walks from ROOT and every parent it reached was itself
    verified by its full key (induction over the chain)."""

    digest: BlockHash
    parent: BlockHash
    token_ids: tuple[int, ...]
    extra_keys: tuple


def _encode(value: object) -> bytes:
    """Type-tagged, length-prefixed encoding: distinct values never share bytes."""
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        text = str(value).encode()
        return b"I" + struct.pack("<I", len(text)) + text
    if isinstance(value, str):
        data = value.encode("utf-8")
        return b"S" + struct.pack("<I", len(data)) + data
    if isinstance(value, bytes):
        return b"B" + struct.pack("<I", len(value)) + value
    if isinstance(value, (tuple, list)):
        return b"L" + struct.pack("<I", len(value)) + b"".join(_encode(v) for v in value)
    raise InvalidInputError(
        f"prefix-cache extra key {value!r} has type {type(value).__name__}; "
        "use None, bool, int, str, bytes or tuples of them"
    )


def hash_block(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    h = hashlib.sha256()
    h.update(parent)
    h.update(struct.pack(f"<Q{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(_encode(tuple(extra_keys)))
    return BlockHash(h.digest())


def make_key(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockKey:
    tokens = tuple(token_ids)
    extra = tuple(extra_keys)
    return BlockKey(hash_block(parent, tokens, extra), parent, tokens, extra)


def key_matches(key: BlockKey, parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple) -> bool:
    """Whether `key` is exactly the key of these inputs, without hashing again."""
    return key.parent == parent and key.token_ids == tuple(token_ids) and key.extra_keys == tuple(extra_keys)


def block_keys(token_ids: Sequence[int], block_size: int, extra_keys: tuple = (), parent: BlockHash = ROOT,
               start: int = 0, max_blocks: int | None = None) -> list[BlockKey]:
    """Keys of the full blocks of token_ids from block `start` on (parent = digest of block start-1)."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, start + max_blocks)
    keys = []
    for i in range(start, n):
        key = make_key(parent, token_ids[i * block_size:(i + 1) * block_size], extra_keys)
        keys.append(key)
        parent = key.digest
    return keys
