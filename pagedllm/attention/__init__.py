"""Paged attention ops: write K/V through a slot mapping, attend through block tables.

`paged_attention(query, kv_cache, meta, scale, impl)` is the one interface the model calls; `impl`
picks the reference (gather + dense) or the block-wise implementation (per-block partials, exact merge).
"""

import torch

from pagedllm.attention.kv_cache import allocate_kv_caches, copy_blocks, kv_cache_bytes_per_block, write_kv
from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.attention.reference import reference_attention

__all__ = [
    "AttentionMetadata",
    "allocate_kv_caches",
    "copy_blocks",
    "kv_cache_bytes_per_block",
    "paged_attention",
    "write_kv",
]

IMPLS = ("reference", "blockwise")


def paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, impl: str = "reference"
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim]; returns the same shape."""
    if impl == "reference":
        return reference_attention(query, kv_cache, meta, scale)
    if impl == "blockwise":
        from pagedllm.attention.blockwise import blockwise_attention

        return blockwise_attention(query, kv_cache, meta, scale)
    raise ValueError(f"unknown attention impl {impl!r}; choose one of {IMPLS}")
