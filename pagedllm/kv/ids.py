"""Distinct id types, so a block id is never mixed up with a token id or a sequence id."""

from typing import NewType

BlockId = NewType("BlockId", int)
SeqId = NewType("SeqId", int)  # the engine hands them out from one counter
BlockHash = NewType("BlockHash", bytes)
