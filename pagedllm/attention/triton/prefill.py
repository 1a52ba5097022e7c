"""Prefill and chunked-prefill attention: new tokens attend to the cached prefix through the block table
and causally to each other.

The new tokens of sequence s sit at positions num_cached .. seq_len-1; query tile t holds BLOCK_M of
them. Both the cached prefix and the new tokens' own K/V (written by the KV write beforehand) are read
through the block table, so a cold prompt and a prefix-cache hit take the same path.
"""

import torch
import triton
import triton.language as tl

from pagedllm.attention.triton.tile import attend_tile, upcast_dot


@triton.jit(do_not_specialize=["stride_table"])  # the block table's width changes from step to step
def paged_prefill_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, seq_lens_ptr, query_start_ptr, tile_seq_ptr, tile_start_ptr,
    scale,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kvh, stride_block, stride_slot, stride_table,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):
    """Grid: (num_query_tiles, num_kv_heads). One program, BLOCK_M new tokens of one sequence times the
    GROUP query heads of one KV head: BLOCK_M * GROUP_PAD rows, row r = (token r // GROUP_PAD, head r % GROUP_PAD).

    Memory traffic per program: its query rows once (BLOCK_M * GROUP * head_dim elements), the output rows
    once, and the K and V rows of positions 0 .. num_cached + last token of the tile (causal: later
    keys are never loaded), each once, shared by all rows of the tile. Over a sequence's T tiles that is
    T * num_cached + about query_len**2 / (2 * BLOCK_M) K/V rows: the cached prefix is read once per tile.
    """
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile)
    tile_start = tl.load(tile_start_ptr + tile)  # first new token of the tile, counted from the sequence's first
    seq_len = tl.load(seq_lens_ptr + seq)
    q_first = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - q_first
    num_cached = seq_len - query_len

    r = tl.arange(0, BLOCK_M * GROUP_PAD)
    token = tile_start + r // GROUP_PAD
    g = r % GROUP_PAD
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    row_ok = (token < query_len) & (g < GROUP)
    d_ok = offs_d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_off = (q_first + token)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + q_off, mask=io_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(k_ptr.dtype.element_ty)

    k_plane = k_ptr + kv_head.to(tl.int64) * stride_kvh
    v_plane = v_ptr + kv_head.to(tl.int64) * stride_kvh
    table = tables_ptr + seq * stride_table
    q_pos = num_cached + token
    key_end = tl.minimum(seq_len, num_cached + tile_start + BLOCK_M)
    m_i = tl.full([BLOCK_M * GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M * GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    for n0 in range(0, key_end, BLOCK_N):
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, k_plane, v_plane, table, n0, key_end, q_pos, scale,
            offs_d, d_ok, stride_block, stride_slot, BLOCK_SIZE, BLOCK_N, UPCAST,
        )

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_off = (q_first + token)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_off, o.to(out_ptr.dtype.element_ty), mask=io_mask)


def prefill_block_m(group: int, rows: int = 64) -> int:
    """New tokens per query tile: about `rows` rows of (token, query head) per program, at least one token."""
    return max(1, rows // triton.next_power_of_2(group))


def launch_prefill(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    meta_tensors: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    tile_seq: torch.Tensor,
    tile_start: torch.Tensor,
    scale: float,
    block_m: int,
    block_n: int,
) -> None:
    """Fill out's rows of the tiles (tile_seq, tile_start); meta_tensors = (block_tables, seq_lens, query_start_loc)."""
    block_tables, seq_lens, query_start_loc = meta_tensors
    _, kvh, _, block_size, head_dim = kv_cache.shape
    group = query.shape[1] // kvh
    paged_prefill_kernel[(tile_seq.shape[0], kvh)](
        query, kv_cache[0], kv_cache[1], out, block_tables, seq_lens, query_start_loc, tile_seq, tile_start,
        scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3), block_tables.stride(0),
        GROUP=group, GROUP_PAD=triton.next_power_of_2(group), BLOCK_M=block_m,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_N=block_n, UPCAST=upcast_dot(kv_cache.dtype),
    )
