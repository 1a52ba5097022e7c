"""KV-pool writes and block copies with the Triton kernels; same contracts as kv_cache.write_kv / copy_blocks."""

import torch

from pagedllm.attention.triton.loader import check_device, kernels


def triton_write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store each token's K and V at its slot; slots of -1 are skipped.

    key, value: [num_tokens, num_kv_heads, head_dim]; slot_mapping: [num_tokens] int64.
    """
    check_device(kv_cache)
    key, value = (x if x.stride(-1) == 1 else x.contiguous() for x in (key, value))
    kernels()["kv_write"].launch_write_kv(key, value, kv_cache, slot_mapping)


def triton_copy_blocks(
    kv_caches: list[torch.Tensor], copies: list[tuple[int, int]], dst_caches: list[torch.Tensor] | None = None
) -> None:
    """Copy every layer's K and V of block src into block dst, for each (src, dst) in copies.

    Without dst_caches the copy stays inside each pool (copy-on-write); with them, layer i's blocks go from
    kv_caches[i] to dst_caches[i] (two pools on the same device).
    """
    if not copies:
        return
    check_device(kv_caches[0])
    pairs = torch.tensor(copies, dtype=torch.int64, device=kv_caches[0].device)
    launch = kernels()["block_copy"].launch_copy_blocks
    for src, dst in zip(kv_caches, dst_caches if dst_caches is not None else kv_caches, strict=True):
        launch(src, dst, pairs)
