"""Write each new token's K and V into the pool at its slot (slot = block_id * block_size + offset)."""

import torch
import triton
import triton.language as tl


@triton.jit
def write_kv_kernel(
    key_ptr, value_ptr, k_ptr, v_ptr, slots_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_kvh, stride_block, stride_slot,
    NUM_KV_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """Grid: (num_tokens,). One program, one token: all its KV heads.

    Memory traffic per program: reads the token's slot and its K and V (2 * num_kv_heads * head_dim
    elements), writes the same amount into the cache. A slot of -1 reads and writes nothing else.
    """
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    block = slot // BLOCK_SIZE
    h = tl.arange(0, HEADS_PAD).to(tl.int64)  # int64: offsets in a large pool pass 2^31
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    # slot -1 keeps no head; a scalar condition folded into the bound (the interpreter mishandles scalar & vector)
    mask = (h < tl.where(slot >= 0, NUM_KV_HEADS, 0))[:, None] & (offs_d < HEAD_DIM)[None, :]
    cache_off = block * stride_block + (slot % BLOCK_SIZE) * stride_slot + h[:, None] * stride_kvh + offs_d[None, :]
    key = tl.load(key_ptr + t * stride_kt + h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    value = tl.load(value_ptr + t * stride_vt + h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    tl.store(k_ptr + cache_off, key.to(k_ptr.dtype.element_ty), mask=mask)
    tl.store(v_ptr + cache_off, value.to(v_ptr.dtype.element_ty), mask=mask)


def launch_write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key, value: [num_tokens, num_kv_heads, head_dim] (last dim contiguous); slot_mapping: [num_tokens]."""
    num_tokens, kvh, head_dim = key.shape
    if num_tokens == 0:
        return
    write_kv_kernel[(num_tokens,)](
        key, value, kv_cache[0], kv_cache[1], slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        NUM_KV_HEADS=kvh, HEADS_PAD=triton.next_power_of_2(kvh),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim), BLOCK_SIZE=kv_cache.shape[3],
    )
