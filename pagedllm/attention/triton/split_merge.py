"""Merge the decode splits exactly, with the rule of pagedllm.attention.merge.merge_partials.

For one query head with splits p (m_p, l_p, o_p): M = max_p m_p, w_p = l_p * exp(m_p - M) and
o = sum_p w_p o_p / sum_p w_p. Every exponent is <= 0, so nothing overflows; splits past the sequence's
end were never written and get weight 0.
"""

import torch
import triton
import triton.language as tl


SPLITS_BLOCK = 16  # splits loaded at a time: one compiled kernel, whatever a step's number of splits


@triton.jit(do_not_specialize=["split_len", "num_splits"])
def merge_splits_kernel(
    m_ptr, l_ptr, o_ptr, seq_lens_ptr, seq_ids_ptr, rows_ptr, out_ptr,
    split_len, num_heads, num_splits, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLITS_BLOCK: tl.constexpr,
):
    """Grid: (num_decode_seqs, num_heads). One program, one query head of one sequence.

    Memory traffic per program: the sequence's written splits' m (twice: the max first, then the weights),
    l (2 * splits float32) and o (splits * head_dim float32), then one head_dim row of the output in the
    query dtype. Small next to the decode kernel, which reads the whole context.
    """
    i = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + tl.load(seq_ids_ptr + i))
    written = tl.minimum((seq_len + split_len - 1) // split_len, num_splits)  # splits that hold a key
    first = (i * num_heads + head) * num_splits
    offs_d = tl.arange(0, HEAD_DIM_PAD)
    d_ok = offs_d < HEAD_DIM
    big_m = tl.full([], float("-inf"), dtype=tl.float32)
    for p0 in range(0, written, SPLITS_BLOCK):
        p = p0 + tl.arange(0, SPLITS_BLOCK)
        big_m = tl.maximum(big_m, tl.max(tl.load(m_ptr + first + p, mask=p < written, other=float("-inf")), axis=0))
    big_m = tl.where(big_m == float("-inf"), 0.0, big_m)
    total = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    for p0 in range(0, written, SPLITS_BLOCK):
        p = p0 + tl.arange(0, SPLITS_BLOCK)
        p_ok = p < written
        m = tl.load(m_ptr + first + p, mask=p_ok, other=float("-inf"))
        l = tl.load(l_ptr + first + p, mask=p_ok, other=0.0)
        o = tl.load(o_ptr + (first + p)[:, None] * HEAD_DIM + offs_d[None, :], mask=p_ok[:, None] & d_ok[None, :],
                    other=0.0)  # fmt: skip
        w = tl.where(l > 0, l * tl.exp(m - big_m), 0.0)  # [SPLITS_BLOCK]
        total += tl.sum(w, axis=0)
        acc += tl.sum(tl.where(w[:, None] > 0, w[:, None] * o, 0.0), axis=0)
    out = acc / tl.maximum(total, 1.1754943508222875e-38)
    row = tl.load(rows_ptr + i)
    tl.store(out_ptr + row * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty), mask=d_ok)


def launch_merge(
    m: torch.Tensor,
    l: torch.Tensor,
    o: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_ids: torch.Tensor,
    rows: torch.Tensor,
    split_len: int,
    out: torch.Tensor,
) -> None:
    """Write the merged output of each decode sequence's query row into out: [num_tokens, H, head_dim]."""
    num_decode, num_heads, num_splits, head_dim = o.shape
    merge_splits_kernel[(num_decode, num_heads)](
        m, l, o, seq_lens, seq_ids, rows, out,
        split_len, num_heads, num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        SPLITS_BLOCK=SPLITS_BLOCK,
    )
