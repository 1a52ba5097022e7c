"""Paged attention ops: write K/V through a slot mapping, attend through block tables.

`paged_attention(query, kv_cache, meta, scale, impl)` is the one interface the model calls; `impl` picks:

- "auto" (default): on the CPU "compiled" where the compiled kernels load and cover the head size and dtype,
  else "fast"; on CUDA "triton" (choice.py).
- "compiled": one C++ kernel call for the whole mixed batch, reading K/V through the block tables in place
  (compiled.py, pagedllm/csrc/paged_attention.cpp).
- "fast": the torch path (fast.py): one batched padded matmul pair per chunk of decode sequences, torch SDPA
  per prefill sequence (is_causal when nothing is cached).
- "reference": gather each sequence's K/V, repeat KV heads, dense SDPA with an explicit mask.
- "blockwise": softmax partials per group of blocks, merged exactly (merge.py).
- "triton": the Triton kernels (triton/), for CUDA tensors. Under TRITON_INTERPRET=1 they also run on CPU
  tensors (the tests).

On CUDA, write_kv uses the Triton KV-write kernel when triton is installed.

KV layout per layer: [2, num_kv_heads, num_blocks, block_size, head_dim]; see docs/attention.md.
"""

import torch

from pagedllm.attention.choice import IMPLS, resolve_attention_impl
from pagedllm.attention.kv_cache import (
    allocate_kv_caches,
    copy_blocks,
    gather_blocks,
    kv_cache_bytes_per_block,
    write_kv,
)
from pagedllm.attention.merge import merge_partials
from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.attention.reference import reference_attention
from pagedllm.errors import InvalidInputError

__all__ = [
    "AttentionMetadata",
    "allocate_kv_caches",
    "copy_blocks",
    "gather_blocks",
    "kv_cache_bytes_per_block",
    "merge_partials",
    "paged_attention",
    "resolve_attention_impl",
    "write_kv",
]

def paged_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, impl: str = "auto"
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim]; returns the same shape."""
    _check_shapes(query, kv_cache)
    if impl == "auto" or impl not in IMPLS:  # a name already resolved (the engine's) runs as given
        impl = resolve_attention_impl(impl, query.shape[-1], query.dtype, query.device)
    if impl == "compiled":
        from pagedllm.attention.compiled import compiled_attention

        return compiled_attention(query, kv_cache, meta, scale)
    if impl == "fast":
        from pagedllm.attention.fast import fast_attention

        return fast_attention(query, kv_cache, meta, scale)
    if impl == "reference":
        return reference_attention(query, kv_cache, meta, scale)
    if impl == "blockwise":
        from pagedllm.attention.blockwise import blockwise_attention

        return blockwise_attention(query, kv_cache, meta, scale)
    from pagedllm.attention.triton import triton_attention  # "triton", the one name left

    return triton_attention(query, kv_cache, meta, scale)


def _check_shapes(query: torch.Tensor, kv_cache: torch.Tensor) -> None:
    """The kernels read the pool's rows as contiguous head_dim vectors, each KV head serving a whole group."""
    num_heads, head_dim = query.shape[1:]
    num_kv_heads, cache_head_dim = kv_cache.shape[1], kv_cache.shape[-1]
    if head_dim != cache_head_dim or num_heads % num_kv_heads:
        raise InvalidInputError(f"query heads {num_heads} x {head_dim} do not fit a KV pool of {num_kv_heads} "
                                f"heads x {cache_head_dim} (query heads must be a multiple of the KV heads)")
    if kv_cache.stride(-1) != 1:
        raise InvalidInputError("the KV pool's head_dim must be contiguous (stride 1)")
