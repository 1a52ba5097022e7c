"""Paged decode attention, split along the context: partial softmax results per (sequence, KV head, split).

Each decode sequence has one query token. Split p of a sequence covers key positions
[p * split_len, min((p + 1) * split_len, seq_len)); the program for it writes, per query head of the
group, the split's max score m, sum of exponentials l and normalised output o = acc / l. split_merge.py
then combines the splits exactly. Splits let a few long sequences still fill the GPU.
"""

import torch
import triton
import triton.language as tl

from pagedllm.attention.triton.tile import attend_tile, upcast_dot


@triton.jit(do_not_specialize=["split_len", "num_splits", "stride_table"])  # they change from step to step
def paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, tables_ptr, seq_lens_ptr, seq_ids_ptr, rows_ptr,
    m_ptr, l_ptr, o_ptr,  # partials: m, l [num_decode, H, P] f32; o [num_decode, H, P, head_dim] f32
    scale, split_len, num_heads, num_splits,
    stride_qt, stride_qh, stride_kvh, stride_block, stride_slot, stride_table,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
):
    """Grid: (num_decode_seqs, num_kv_heads, num_splits). One program, one split of one sequence's keys.

    Memory traffic per program: the group's GROUP query rows once (GROUP * head_dim elements), the
    split's block-table entries, and every K and V row of the split exactly once (2 * split_len *
    head_dim elements of the cache dtype, one contiguous head_dim row per key); writes GROUP * (head_dim
    + 2) float32. Over the grid, each cached K/V row of a decode sequence is read once per step, shared by
    the GROUP query heads. A split starting at or past seq_len reads and writes nothing.
    Rows are padded to GROUP_PAD >= 16 (tl.dot's minimum); the padding rows are zero and never stored.
    """
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(seq_ids_ptr + i)
    seq_len = tl.load(seq_lens_ptr + seq)
    row = tl.load(rows_ptr + i)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    g_ok = g < GROUP
    d_ok = offs_d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_mask = g_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :], mask=q_mask, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    else:
        q = q.to(k_ptr.dtype.element_ty)

    k_plane = k_ptr + kv_head.to(tl.int64) * stride_kvh
    v_plane = v_ptr + kv_head.to(tl.int64) * stride_kvh
    table = tables_ptr + seq * stride_table
    q_pos = tl.zeros([GROUP_PAD], dtype=tl.int64) + (seq_len - 1)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        m_i, l_i, acc = attend_tile(
            q, m_i, l_i, acc, k_plane, v_plane, table, n0, end, q_pos, scale,
            offs_d, d_ok, stride_block, stride_slot, BLOCK_SIZE, BLOCK_N, UPCAST,
        )

    # A scalar condition folded into the bound: the interpreter mishandles scalar & vector masks.
    store = g < tl.where(start < seq_len, GROUP, 0)
    part = (i * num_heads + heads) * num_splits + split  # [GROUP_PAD] index into m, l
    tl.store(m_ptr + part, m_i, mask=store)
    tl.store(l_ptr + part, l_i, mask=store)
    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], o, mask=store[:, None] & d_ok[None, :])


def launch_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_ids: torch.Tensor,
    rows: torch.Tensor,
    scale: float,
    split_len: int,
    num_splits: int,
    block_n: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Partials (m, l, o) of the decode sequences seq_ids (query rows `rows`); see paged_decode_kernel."""
    _, kvh, _, block_size, head_dim = kv_cache.shape
    num_decode, num_heads = seq_ids.shape[0], query.shape[1]
    group = num_heads // kvh
    m = torch.empty(num_decode, num_heads, num_splits, dtype=torch.float32, device=query.device)
    l = torch.empty_like(m)
    o = torch.empty(num_decode, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    paged_decode_kernel[(num_decode, kvh, num_splits)](
        query, kv_cache[0], kv_cache[1], block_tables, seq_lens, seq_ids, rows,
        m, l, o,
        scale, split_len, num_heads, num_splits,
        query.stride(0), query.stride(1), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_N=block_n, UPCAST=upcast_dot(kv_cache.dtype),
    )
    return m, l, o
