"""Device functions shared by the attention kernels: read a tile of keys through a block table and fold it
into an online softmax.

A tile is BLOCK_N consecutive key positions of one sequence and one KV head. Position p lives at
(block_table[p // BLOCK_SIZE], p % BLOCK_SIZE), so a tile may span several physical blocks (or, with
BLOCK_SIZE = 1, one block per key): each key row of head_dim elements is one contiguous load.
"""

import torch
import triton
import triton.language as tl

from pagedllm.attention.triton.loader import interpreting


@triton.jit
def kv_tile_offsets(table_ptr, pos, ok, stride_block, stride_slot, BLOCK_SIZE: tl.constexpr):
    """Element offsets of key positions `pos` [BLOCK_N] in one KV head's [num_blocks, block_size, d] plane."""
    block = tl.load(table_ptr + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    return block * stride_block + (pos % BLOCK_SIZE).to(tl.int64) * stride_slot


@triton.jit
def attend_tile(
    q, m_i, l_i, acc,  # q: [R, D] in the cache dtype; m_i, l_i: [R] f32; acc: [R, D] f32
    k_plane, v_plane, table_ptr,  # this KV head's K and V planes; the sequence's block table row
    n0, key_end, q_pos, scale,  # tile start, keys visible below key_end, q_pos: [R] causal limit per row
    offs_d, d_ok, stride_block, stride_slot,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):
    """One online-softmax step over keys n0 .. n0+BLOCK_N-1; returns the updated (m_i, l_i, acc).

    Row r sees key p when p < key_end and p <= q_pos[r]. m_i is the running max of the scaled scores,
    l_i the running sum of exp(s - m_i), acc the running sum of exp(s - m_i) * v (unnormalised).
    UPCAST: multiply in float32 whatever the cache dtype (see upcast_dot); q must then be float32.
    """
    pos = n0 + tl.arange(0, BLOCK_N)
    ok = pos < key_end
    offs = kv_tile_offsets(table_ptr, pos, ok, stride_block, stride_slot, BLOCK_SIZE)
    ptrs = offs[:, None] + offs_d[None, :]
    kv_mask = ok[:, None] & d_ok[None, :]
    k = tl.load(k_plane + ptrs, mask=kv_mask, other=0.0)  # [BLOCK_N, D]
    v = tl.load(v_plane + ptrs, mask=kv_mask, other=0.0)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # [R, BLOCK_N] f32
    s = tl.where(ok[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    # A row that has seen no key yet keeps m = -inf; shifting by 0 then gives exp(-inf) = 0, never NaN.
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - shift)
    p = tl.exp(s - shift[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    return m_new, l_i, acc


def upcast_dot(cache_dtype: torch.dtype) -> bool:
    """Whether the kernels multiply in float32 rather than in the cache dtype.

    Compiled, a 16-bit cache multiplies natively (tensor cores, float32 accumulation). The interpreter's
    tl.dot multiplies 16-bit floats as their raw integer bits, so under it they are converted first.
    """
    return cache_dtype != torch.float32 and interpreting()
