"""The KV pool tensors and the ops that write into them.

Layout, one tensor per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (index 0 = K, 1 = V).
Flat slot s = block_id * block_size + offset addresses row s of the [2, num_blocks * block_size, ...] view.
"""

import torch


def allocate_kv_caches(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(num_layers)]


def kv_cache_bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    element_size = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element_size


def write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store each token's K and V at its slot; slots of -1 are skipped.

    key, value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int64.
    """
    keep = slot_mapping >= 0
    if not bool(keep.all()):
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    flat = kv_cache.view(2, -1, *kv_cache.shape[-2:])
    flat[0].index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def copy_blocks(kv_caches: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """Copy-on-write support: copy every layer's K and V of block src into block dst."""
    if not copies:
        return
    src = torch.tensor([s for s, _ in copies], dtype=torch.int64)
    dst = torch.tensor([d for _, d in copies], dtype=torch.int64)
    for cache in kv_caches:
        cache[:, dst] = cache[:, src]
