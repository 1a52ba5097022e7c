import pytest
import torch

from pagedllm.attention.merge import merge_partials, softmax_partial


def full_softmax(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return scores.double().softmax(-1) @ values.double()


def partials(scores: torch.Tensor, values: torch.Tensor, cuts: list[int]):
    """Split keys at cuts; stack each part's (m, l, o) along a new dim -1 (o: dim -2)."""
    ms, ls, os_ = [], [], []
    for lo, hi in zip([0] + cuts, cuts + [scores.shape[-1]]):
        m, l, o = softmax_partial(scores[..., lo:hi], values[..., lo:hi, :])
        ms.append(m), ls.append(l), os_.append(o)
    return torch.stack(ms, -1), torch.stack(ls, -1), torch.stack(os_, -2)


@pytest.mark.parametrize("cuts", [[5], [1, 2, 3, 10], [3, 4, 19], list(range(1, 20))])
def test_merge_equals_softmax_over_concatenation(cuts: list[int]) -> None:
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 4, 20, generator=gen, dtype=torch.float64) * 3  # [..., rows, keys]
    values = torch.randn(2, 3, 20, 8, generator=gen, dtype=torch.float64)
    m, l, o = partials(scores, values, cuts)
    big_m, total, out = merge_partials(m, l, o, dim=-1)
    torch.testing.assert_close(out, full_softmax(scores, values), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(big_m, scores.amax(-1))
    torch.testing.assert_close(total, torch.exp(scores - scores.amax(-1, keepdim=True)).sum(-1))


def test_parts_on_very_different_scales_do_not_overflow() -> None:
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(4, 12, generator=gen)
    scores[:, 4:8] += 1000.0  # the middle part dominates completely
    scores[:, 8:] -= 1000.0
    values = torch.randn(12, 5, generator=gen)
    m, l, o = partials(scores, values, [4, 8])
    _, _, out = merge_partials(m, l, o)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, full_softmax(scores, values).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, full_softmax(scores[:, 4:8], values[4:8]).float(), rtol=1e-5, atol=1e-5)


def test_fully_masked_parts_get_zero_weight_and_all_masked_gives_zero() -> None:
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 9, generator=gen)
    values = torch.randn(9, 4, generator=gen)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[0, :3] = False  # row 0: the whole first part is masked
    mask[2, :] = False  # row 2: everything masked
    ms, ls, os_ = [], [], []
    for lo, hi in [(0, 3), (3, 9)]:
        m, l, o = softmax_partial(scores[:, lo:hi], values[lo:hi], mask[:, lo:hi])
        ms.append(m), ls.append(l), os_.append(o)
    assert torch.isneginf(ms[0][0]) and ls[0][0] == 0
    _, total, out = merge_partials(torch.stack(ms), torch.stack(ls), torch.stack(os_), dim=0)
    assert not torch.isnan(out).any()
    expected = full_softmax(scores[:2].masked_fill(~mask[:2], float("-inf")), values).float()
    torch.testing.assert_close(out[:2], expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[2], torch.zeros(4)) and total[2] == 0


def test_nan_output_of_a_masked_part_does_not_leak() -> None:
    m = torch.tensor([[0.5, float("-inf")]])
    l = torch.tensor([[2.0, 0.0]])
    o = torch.tensor([[[1.0, 2.0], [float("nan"), float("nan")]]])
    _, _, out = merge_partials(m, l, o)
    assert torch.equal(out, torch.tensor([[1.0, 2.0]]))


def test_merging_merges_is_associative() -> None:
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(5, 16, generator=gen, dtype=torch.float64)
    values = torch.randn(16, 3, generator=gen, dtype=torch.float64)
    m, l, o = partials(scores, values, [2, 7, 11])
    left = merge_partials(m[:, :2], l[:, :2], o[:, :2])
    right = merge_partials(m[:, 2:], l[:, 2:], o[:, 2:])
    _, _, out = merge_partials(*(torch.stack(x, -1) for x in zip(left[:2], right[:2])), torch.stack([left[2], right[2]], -2))
    torch.testing.assert_close(out, full_softmax(scores, values))


def test_a_row_with_no_kept_key_is_minus_inf_zero_and_zero() -> None:
    """softmax_partial's promise for a fully masked row (m = -inf, l = 0, o = 0, not 0/0), which a caller that
    merges without merge_partials' guard relies on."""
    scores = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.25, 4.0]])
    values = torch.arange(6.0).view(3, 2)
    mask = torch.tensor([[True, True, False], [False, False, False]])
    m, l, o = softmax_partial(scores, values, mask)
    assert torch.isneginf(m[1]) and l[1] == 0 and torch.equal(o[1], torch.zeros(2))
    torch.testing.assert_close(o[0], scores[0, :2].softmax(-1) @ values[:2])


def test_a_merge_of_masked_parts_merges_again_as_a_masked_part() -> None:
    """Its M is -inf, not 0: merged again beside a part whose scores all lie near -1000 (a long context's
    partial), that part must keep its weight, where exp(-1000 - 0) would make it 0."""
    gen = torch.Generator().manual_seed(5)
    scores, values = torch.randn(2, 6, generator=gen) - 1000.0, torch.randn(6, 3, generator=gen)
    masked = softmax_partial(scores[:, :2], values[:2], torch.zeros(2, 2, dtype=torch.bool))
    empty = merge_partials(*(torch.stack([x, x], -1) for x in masked[:2]), torch.stack([masked[2]] * 2, -2))
    assert torch.isneginf(empty[0]).all() and (empty[1] == 0).all()
    far = softmax_partial(scores, values)
    _, _, out = merge_partials(*(torch.stack([a, b], -1) for a, b in zip(empty[:2], far[:2])),
                               torch.stack([empty[2], far[2]], -2))
    torch.testing.assert_close(out.double(), full_softmax(scores, values), rtol=1e-5, atol=1e-5)
