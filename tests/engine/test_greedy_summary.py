"""The compiled per-row argmax and logsumexp the sampler starts from (pagedllm/csrc/sampling_ops.cpp) against
torch's, and the sampler's results with it against the same results without it."""

import pytest
import torch
from compiled_kernels import require_compiled_kernels

from pagedllm.engine import sampler
from pagedllm.engine.sampler import SamplingRow, make_generator, sample
from pagedllm.sampling_params import SamplingParams

INF, NAN = float("inf"), float("nan")


@pytest.fixture(scope="module")
def kernels():
    return require_compiled_kernels()


def logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4


def check_against_torch(module, x: torch.Tensor) -> None:
    picks, log_z = module.greedy_summary(x)
    assert picks.dtype == torch.int64 and log_z.dtype == torch.float32 and picks.shape == log_z.shape == x.shape[:1]
    assert torch.equal(picks, x.argmax(dim=-1))
    torch.testing.assert_close(log_z, x.logsumexp(dim=-1), rtol=1e-6, atol=2e-6)


@pytest.mark.parametrize("vocab", [1, 7, 8, 17, 384, 49152])
def test_argmax_and_logsumexp_equal_torchs(kernels, vocab: int) -> None:
    check_against_torch(kernels, logits(5, vocab, seed=vocab))


def test_ties_pick_the_first_maximum_and_minus_infinity_counts_for_nothing(kernels) -> None:
    x = logits(3, 100)
    x[0, [11, 40, 99]] = 50.0
    x[1, :90] = -INF
    x[2, 0] = x[2].max()
    check_against_torch(kernels, x)
    assert kernels.greedy_summary(x)[0][0].item() == 11


@pytest.mark.parametrize("places", [(47, 48, 100), (63, 64), (130, 2000, 49151), (5, 49151), (10, 49155), (49153, 49158)])
def test_the_first_of_tied_maxima_wherever_they_fall(kernels, places: tuple[int, ...]) -> None:
    """Ties in different lanes, vectors and passes of the vectorised maximum, and in the scalar tail."""
    x = logits(2, 49152 + 7, seed=len(places))
    x[:, list(places)] = 50.0
    x[1, places[-1] + 1 :] = -INF
    check_against_torch(kernels, x)
    assert (kernels.greedy_summary(x)[0] == places[0]).all()


def test_rows_may_be_further_apart_than_their_width(kernels) -> None:
    wide = logits(4, 50)
    check_against_torch(kernels, wide[:, 3:40])


def test_a_nan_or_an_infinite_maximum_gives_a_nan_log_z_for_that_row_only(kernels) -> None:
    x = logits(4, 33)
    x[1, 20] = NAN
    x[2, 5] = INF
    x[3, :] = -INF
    log_z = kernels.greedy_summary(x)[1]
    assert torch.isnan(log_z[1:]).all() and torch.isfinite(log_z[0])


def test_bad_arguments_raise(kernels) -> None:
    with pytest.raises(RuntimeError, match="float32"):
        kernels.greedy_summary(logits(2, 8).bfloat16())
    with pytest.raises(RuntimeError, match="rows"):
        kernels.greedy_summary(logits(2, 8)[0])
    with pytest.raises(RuntimeError, match="contiguous rows"):
        kernels.greedy_summary(logits(8, 2).t())
    with pytest.raises(RuntimeError, match="at least one column"):
        kernels.greedy_summary(torch.empty(2, 0))


def mixed_batch(x: torch.Tensor) -> list:
    """Greedy rows (with and without logprobs), a penalised row and seeded random rows in one batch."""
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, logprobs=3),
              SamplingParams(temperature=0.0, repetition_penalty=1.3), SamplingParams(temperature=0.9, seed=5),
              SamplingParams(temperature=1.0, top_p=0.8, seed=6, logprobs=2)]  # fmt: skip
    rows = [SamplingRow(p, make_generator(p.seed), [1, 2, 3], [4, 5]) for p in params]
    return sample(x, rows, eos_token_ids={0})


def greedy_batch(x: torch.Tensor) -> list:
    return sample(x, [SamplingRow(SamplingParams(temperature=0.0), None, [], []) for _ in x], eos_token_ids=set())


@pytest.mark.parametrize("batch", [mixed_batch, greedy_batch])
def test_the_sampler_gives_the_same_results_with_and_without_it(kernels, monkeypatch, batch) -> None:
    x = logits(5, 384, seed=1)
    x[2, 4] = x[2].max() + 0.1  # row 2's penalty (mixed batch) moves its pick away from its raw argmax
    assert sampler._log_normaliser(x)[1] is not None  # the compiled pass is the one taken here
    with_kernel = batch(x)
    monkeypatch.setattr(sampler, "load_cpu_kernels", lambda: None)
    without = batch(x)
    assert [r.token_id for r in with_kernel] == [r.token_id for r in without]
    for a, b in zip(with_kernel, without):
        assert a.logprob == pytest.approx(b.logprob, abs=2e-6)
        assert (a.top_logprobs is None) == (b.top_logprobs is None)
        if a.top_logprobs is not None:
            assert a.top_logprobs.keys() == b.top_logprobs.keys()
            assert list(a.top_logprobs.values()) == pytest.approx(list(b.top_logprobs.values()), abs=2e-6)


def test_a_batch_with_a_nan_row_goes_to_torch_whole(kernels) -> None:
    x = logits(3, 40)
    x[1, 7] = NAN
    log_z, picks = sampler._log_normaliser(x)
    assert picks is None
    torch.testing.assert_close(log_z, x.logsumexp(dim=-1, keepdim=True), equal_nan=True)
