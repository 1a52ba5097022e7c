"""Copy whole KV blocks: copy-on-write inside one pool, or between two pools on the same device (swap).

Moving blocks between GPU memory and pinned host memory is a DMA copy, not a kernel: torch's
index_select / copy_(non_blocking=True) does it.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def copy_blocks_kernel(
    src_ptr, dst_ptr, pairs_ptr,
    src_stride_kv, src_stride_kvh, src_stride_block, dst_stride_kv, dst_stride_kvh, dst_stride_block,
    NUM_KV_HEADS: tl.constexpr, BLOCK_ELEMS: tl.constexpr, BLOCK_ELEMS_PAD: tl.constexpr,
):
    """Grid: (num_pairs, 2 * num_kv_heads). One program copies one (K or V, head) plane of one block.

    Memory traffic per program: reads the source block's block_size * head_dim elements (contiguous) and
    writes them to the destination block; the pair list is read once. Total: 2 * kvh * block_size *
    head_dim elements read and written per pair.
    """
    pair = tl.program_id(0)
    which = (tl.program_id(1) // NUM_KV_HEADS).to(tl.int64)  # int64: offsets in a large pool pass 2^31
    head = (tl.program_id(1) % NUM_KV_HEADS).to(tl.int64)
    src_block = tl.load(pairs_ptr + 2 * pair)
    dst_block = tl.load(pairs_ptr + 2 * pair + 1)
    offs = tl.arange(0, BLOCK_ELEMS_PAD)
    mask = offs < BLOCK_ELEMS
    src = src_ptr + which * src_stride_kv + head * src_stride_kvh + src_block * src_stride_block
    dst = dst_ptr + which * dst_stride_kv + head * dst_stride_kvh + dst_block * dst_stride_block
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def launch_copy_blocks(src: torch.Tensor, dst: torch.Tensor, pairs: torch.Tensor) -> None:
    """pairs: [num_pairs, 2] int64 (src block, dst block) on the caches' device; both caches contiguous per block."""
    _, kvh, _, block_size, head_dim = src.shape
    if dst.shape[:2] != src.shape[:2] or dst.shape[3:] != src.shape[3:]:
        raise ValueError(f"block shapes differ: {tuple(src.shape)} vs {tuple(dst.shape)}")
    for cache in (src, dst):
        if cache.stride(3) != head_dim or cache.stride(4) != 1:
            raise ValueError("each block's [block_size, head_dim] plane must be contiguous")
    elems = block_size * head_dim
    copy_blocks_kernel[(pairs.shape[0], 2 * kvh)](
        src, dst, pairs,
        src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1), dst.stride(2),
        NUM_KV_HEADS=kvh, BLOCK_ELEMS=elems, BLOCK_ELEMS_PAD=triton.next_power_of_2(elems),
    )
