"""Exact merge of softmax partials: attention over a union of key sets from attention over each part.

Part p of the keys gives, per query row, m_p = max score, l_p = sum_j exp(s_j - m_p) and the locally
normalised output o_p = sum_j exp(s_j - m_p) v_j / l_p. With M = max_p m_p and w_p = l_p * exp(m_p - M):

    o = sum_p w_p o_p / sum_p w_p,    and the merged part has max M and sum of exponentials sum_p w_p.

Every exponent is <= 0, so parts whose scores differ by thousands neither overflow nor lose the winner.
A fully masked part (m_p = -inf, l_p = 0) gets weight 0; if every part is masked the output is 0, not NaN.
"""

import torch


def merge_partials(
    m: torch.Tensor, l: torch.Tensor, o: torch.Tensor, dim: int = -1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merge parts along `dim` of m and l (the matching dim of o, which has a trailing head_dim).

    m, l: [..., P, ...] (float); o: [..., P, ..., d]. Returns (M, L, out) with the parts dim removed:
    the merged max, merged sum of exponentials (relative to M) and the merged normalised output.
    """
    dim = dim % m.dim()
    big_m = m.amax(dim=dim, keepdim=True)
    safe_m = torch.where(torch.isneginf(big_m), torch.zeros_like(big_m), big_m)
    w = l * torch.exp(m - safe_m)  # [..., P, ...]; 0 for masked parts
    total = w.sum(dim=dim, keepdim=True)
    # A masked part's o_p may be NaN (0/0) in callers that do not guard it: weight 0 must win.
    weighted = torch.where(w.unsqueeze(-1) > 0, w.unsqueeze(-1) * o, torch.zeros((), dtype=o.dtype))
    out = weighted.sum(dim=dim) / total.clamp_min(torch.finfo(total.dtype).tiny).unsqueeze(-1).squeeze(dim)
    return big_m.squeeze(dim), total.squeeze(dim), out


def softmax_partial(
    scores: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One part's (m, l, o) from its scores [..., R, K] and values [..., K, d]; mask [..., R, K] True = keep.

    Returns m, l: [..., R] and o: [..., R, d]. Rows with no kept key get m = -inf, l = 0, o = 0.
    """
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    m = scores.amax(dim=-1)
    safe_m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    p = torch.exp(scores - safe_m.unsqueeze(-1))
    l = p.sum(dim=-1)
    o = (p.to(values.dtype) @ values) / l.clamp_min(torch.finfo(l.dtype).tiny).unsqueeze(-1).to(values.dtype)
    return m, l, o
