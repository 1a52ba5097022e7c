"""The split-merge kernel follows merge_partials exactly, ignoring splits past the sequence's end."""

import pytest
import torch

from pagedllm.attention.merge import merge_partials
from pagedllm.attention.triton.loader import kernels


# (splits, seq_lens): 5, 2 and 3 splits written of 5; then 37, 17 and 16 of 37 (several chunks of 16 splits)
@pytest.mark.parametrize("splits,lens", [(5, [40, 9, 17]), (37, [296, 129, 128])])
def test_merge_kernel_matches_merge_partials(splits: int, lens: list[int], device: torch.device) -> None:
    gen = torch.Generator().manual_seed(splits)
    num_seqs, heads, head_dim, split_len = 3, 4, 16, 8
    seq_lens = torch.tensor(lens)
    m = torch.randn(num_seqs, heads, splits, generator=gen) * 1000  # scores 1e3 apart: no overflow, no NaN
    l = torch.rand(num_seqs, heads, splits, generator=gen) + 0.5
    o = torch.randn(num_seqs, heads, splits, head_dim, generator=gen)
    written = torch.arange(splits) < (-(-seq_lens // split_len)).unsqueeze(1)  # [S, P]
    unwritten = ~written.unsqueeze(1).expand_as(m)
    m_garbage, o_garbage = m.masked_fill(unwritten, 1e30), o.masked_fill(unwritten.unsqueeze(-1), float("nan"))

    out = torch.zeros(num_seqs, heads, head_dim, device=device)
    ids, rows = torch.arange(num_seqs, device=device), torch.arange(num_seqs, device=device)
    merge = kernels()["split_merge"].launch_merge
    merge(m_garbage.to(device), l.to(device), o_garbage.to(device), seq_lens.to(device), ids, rows, split_len, out)

    _, _, expected = merge_partials(m.masked_fill(unwritten, float("-inf")), l.masked_fill(unwritten, 0), o, dim=2)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(out).all()
