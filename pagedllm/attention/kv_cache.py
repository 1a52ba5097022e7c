"""The KV pool tensors and the ops that write into them.

Layout, one tensor per layer: [2, num_kv_heads, num_blocks, block_size, head_dim] (index 0 = K, 1 = V).
Heads come before blocks so that gathering a batch's blocks (one index_select on dim 2) yields, per KV
head, each sequence's keys as one contiguous [tokens, head_dim] matrix: the attention matmuls read it
without a transposing copy (see docs/attention.md for the measurements behind this choice).
Flat slot s = block_id * block_size + offset addresses row s of the [2, kvh, num_blocks * block_size, d] view.
"""

import functools

import torch

def allocate_kv_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> list[torch.Tensor]:
    shape = (2, num_kv_heads, num_blocks, block_size, head_dim)
    return [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]


def kv_cache_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size


def cache_block_size(kv_cache: torch.Tensor) -> int:
    return kv_cache.shape[3]


def write_kv(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor, impl: str = "auto"
) -> None:
    """Store each token's K and V at its slot; slots of -1 are skipped.

    key, value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int64. The Triton kernel
    writes on CUDA where triton is installed, and wherever the attention is `impl="triton"` (CPU tensors under
    the interpreter: the tests); torch everywhere else.
    """
    if impl == "triton" or kv_cache.is_cuda and _triton_installed():
        # The Triton kernel skips slots of -1 itself: no mask, no host sync (a CUDA graph can capture it).
        from pagedllm.attention.triton import triton_write_kv

        return triton_write_kv(key, value, kv_cache, slot_mapping)
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    two, kvh, _, _, head_dim = kv_cache.shape
    flat = kv_cache.view(two, kvh, -1, head_dim)  # [2, kvh, slots, d]
    flat[0].index_copy_(1, slot_mapping, key.transpose(0, 1).to(kv_cache.dtype))
    flat[1].index_copy_(1, slot_mapping, value.transpose(0, 1).to(kv_cache.dtype))


def gather_blocks(kv_cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """K and V of the given physical blocks, in order: [2, kvh, len(block_ids), block_size, d] (a copy)."""
    return kv_cache.index_select(2, block_ids)


def copy_blocks(kv_caches: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """Copy-on-write support: copy every layer's K and V of block src into block dst. No block may be both a
    source and a destination (each path orders the copies its own way: ModelRunner.copy_blocks checks)."""
    if not copies:
        return
    device = kv_caches[0].device
    src = torch.tensor([s for s, _ in copies], dtype=torch.int64, device=device)
    dst = torch.tensor([d for _, d in copies], dtype=torch.int64, device=device)
    for cache in kv_caches:
        cache.index_copy_(2, dst, cache.index_select(2, src))


def read_tokens(kv_cache: torch.Tensor, blocks: list[int], num_tokens: int) -> torch.Tensor:
    """The first num_tokens positions held by `blocks` (a block table): [2, num_tokens, kvh, d] (a copy)."""
    kv = gather_blocks(kv_cache, torch.tensor(blocks, dtype=torch.int64, device=kv_cache.device))  # [2, kvh, nb, B, d]
    two, kvh, nb, block_size, head_dim = kv.shape
    return kv.view(two, kvh, nb * block_size, head_dim)[:, :, :num_tokens].transpose(1, 2).contiguous()


def write_tokens(kv_cache: torch.Tensor, blocks: list[int], rows: torch.Tensor) -> None:
    """Inverse of read_tokens: rows [2, num_tokens, kvh, d] into positions 0.. of the block table `blocks`."""
    block_size = cache_block_size(kv_cache)
    pos = torch.arange(rows.shape[1], device=kv_cache.device)
    table = torch.tensor(blocks, dtype=torch.int64, device=kv_cache.device)
    slots = table[pos // block_size] * block_size + pos % block_size
    write_kv(rows[0], rows[1], kv_cache, slots)


@functools.cache
def _triton_installed() -> bool:
    from pagedllm.attention.triton import is_available

    return is_available()
