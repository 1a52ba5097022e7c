"""The sampler's compiled passes (pagedllm/csrc/sampling_ops.cpp) against torch's ops: the per-row argmax and
logsumexp it starts from, and the inverse-CDF draw with temperature, top-k, top-p and min-p; and the sampler's
results with them against the same results without them."""

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


@pytest.mark.parametrize("places", [(47, 48, 100), (63, 64), (130, 2000, 49151), (5, 49151), (10, 49155), (49153, 49158),
                                    (5, 21, 37), (5, 37, 69), (5, 69, 133), (5, 133, 261)])  # fmt: skip
def test_the_first_of_tied_maxima_wherever_they_fall(kernels, places: tuple[int, ...]) -> None:
    """Ties in different lanes, vectors and passes of the vectorised maximum, in the same lane of one chain of
    vectors (16 to 128 apart, for AVX2 and AVX-512), and in the scalar tail."""
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


def draw(kernels, x: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor, top_k: int = 0, top_p: float = 1.0,
         min_p: float = 0.0) -> torch.Tensor:
    rows = x.shape[0]
    return kernels.categorical_sample(x, temperature, torch.full((rows,), top_k), torch.full((rows,), top_p),
                                      torch.full((rows,), min_p), u)  # fmt: skip


def torch_probs(x: torch.Tensor, temperature: torch.Tensor, truncation: dict) -> torch.Tensor:
    """The sampler's torch path: the probabilities its inverse-CDF draw walks (zero where truncated)."""
    rows = [SamplingRow(SamplingParams(temperature=float(t), **truncation), None, [], []) for t in temperature]
    scaled = x / temperature[:, None]
    if truncation.get("top_k", 0) or truncation.get("top_p", 1.0) < 1.0:
        return sampler._sorted_truncation(scaled, rows)
    return sampler._min_p(scaled.softmax(dim=-1), rows)


def near_a_boundary(probs: torch.Tensor, u: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Rows whose u lies within 1e-9 of the normalised CDF at the token or the one before it: there float rounding
    may pick either neighbour."""
    cdf = probs.double().cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]
    at = cdf.gather(1, token[:, None]).squeeze(1)
    before = cdf.gather(1, (token - 1).clamp(min=0)[:, None]).squeeze(1)
    return ((at - u).abs() < 1e-9) | ((before - u).abs() < 1e-9)


TRUNCATIONS = [{}, {"top_k": 1}, {"top_k": 50}, {"top_p": 0.9}, {"top_p": 0.999}, {"min_p": 0.1},
               {"top_k": 20, "top_p": 0.5}, {"top_k": 5, "top_p": 0.8, "min_p": 0.05}, {"top_k": 100_000},
               {"top_p": 0.5, "min_p": 0.1}, {"top_k": 1000, "top_p": 0.7, "min_p": 0.3}, {"top_p": 0.9, "min_p": 1e-9}]  # fmt: skip


@pytest.mark.parametrize("truncation", TRUNCATIONS, ids=str)
@pytest.mark.parametrize("vocab", [1, 7, 16, 65, 1000, 49152])
def test_draws_equal_the_torch_paths(kernels, vocab: int, truncation: dict) -> None:
    x = logits(64, vocab, seed=vocab)
    x[5, : vocab // 2] = -INF  # masked tokens
    if vocab > 20:
        x[6, 10:20] = x[6, 3]  # ties: ranked by position
    temperature = torch.rand(64, generator=torch.Generator().manual_seed(1)) * 2 + 0.05
    u = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    u[0], u[1] = 0.0, 1.0 - 2**-53  # both ends of [0, 1)
    got = draw(kernels, x, temperature, u, **truncation)
    probs = torch_probs(x, temperature, truncation)
    expected = sampler._inverse_cdf(probs, u)
    assert got.dtype == torch.int64 and got.shape == (64,)
    differs = got != expected
    assert not differs[~near_a_boundary(probs, u, expected)].any()
    assert (probs.gather(1, got[:, None]) > 0).all()  # never a masked or truncated token


@pytest.mark.parametrize("truncation", [{}, {"top_p": 0.999999}, {"top_k": 950}], ids=str)
def test_a_draw_at_the_top_of_u_never_takes_a_masked_token_after_the_last_live_one(kernels, truncation) -> None:
    """The last tokens masked, as in a padded vocabulary: where float rounding leaves the walk short of its
    target, the draw is the last token of probability above 0."""
    x = logits(256, 1000)
    x[:, 900:] = -INF
    temperature = torch.rand(256, generator=torch.Generator().manual_seed(1)) + 0.5
    tokens = draw(kernels, x, temperature, torch.full((256,), 1.0 - 2**-53, dtype=torch.float64), **truncation)
    assert (tokens >= 0).all() and (tokens < 900).all()


@pytest.mark.parametrize("truncation, kept", [({"top_p": 0.6, "min_p": 0.5}, [0]), ({"top_p": 0.7, "min_p": 0.5}, [0, 1]),
                                              ({"top_k": 2, "top_p": 0.6}, [0]), ({"top_k": 3, "top_p": 0.6}, [0, 1])])
def test_min_p_and_top_k_act_before_top_p_as_in_vllm(kernels, truncation: dict, kept: list[int]) -> None:
    """p = .5, .3, .2: min_p 0.5 leaves .5, .3, renormalised to .625, .375, of which top_p 0.6 keeps the first."""
    x = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).repeat(400, 1)
    u = torch.rand(400, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    assert sorted(set(draw(kernels, x, torch.ones(400), u, **truncation).tolist())) == kept
    assert torch_probs(x[:1], torch.ones(1), truncation).nonzero()[:, 1].tolist() == kept


def test_every_token_is_reachable_and_drawn_as_often_as_its_probability(kernels) -> None:
    x = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).repeat(4000, 1)
    u = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tokens = draw(kernels, x, torch.ones(4000), u)
    freq = torch.bincount(tokens, minlength=4).double() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.03, rtol=0)


def test_a_nan_or_no_finite_maximum_is_left_to_the_caller(kernels) -> None:
    x = logits(5, 40)
    x[1, 3], x[2, :], x[3, 7] = NAN, -INF, INF
    for truncation in [{}, {"top_p": 0.9, "top_k": 3}]:
        tokens = draw(kernels, x, torch.ones(5), torch.full((5,), 0.5, dtype=torch.float64), **truncation)
        assert tokens.tolist()[1:4] == [-1, -1, -1] and tokens[0] >= 0 and tokens[4] >= 0


@pytest.mark.parametrize("column, value", [("temperature", 0.0), ("u", 1.0), ("u", -0.1), ("top_k", -1),
                                           ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1), ("min_p", 2.0)])  # fmt: skip
def test_values_out_of_range_are_refused(kernels, column: str, value: float) -> None:
    args = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "u": 0.5} | {column: value}
    with pytest.raises(RuntimeError, match="temperature must be positive"):
        kernels.categorical_sample(logits(1, 10), torch.tensor([args["temperature"]]), torch.tensor([args["top_k"]]),
                                   torch.tensor([args["top_p"]]), torch.tensor([args["min_p"]]),
                                   torch.tensor([args["u"]], dtype=torch.float64))  # fmt: skip


def test_wrong_dtypes_and_shapes_are_refused(kernels) -> None:
    x, t, u = logits(2, 10), torch.ones(2), torch.full((2,), 0.5, dtype=torch.float64)
    k, p, m = torch.zeros(2, dtype=torch.long), torch.ones(2), torch.zeros(2)
    for args in [(x.double(), t, k, p, m, u), (x, t.double(), k, p, m, u), (x, t, k.float(), p, m, u),
                 (x, t, k, p.double(), m, u), (x, t, k, p, m, u.float()), (x, t[:1], k, p, m, u), (x.t(), t, k, p, m, u)]:
        with pytest.raises(RuntimeError):
            kernels.categorical_sample(*args)


KINDS = [SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=1.0, top_k=5, seed=2),
         SamplingParams(temperature=1.3, seed=3), SamplingParams(temperature=0.9, top_p=0.8, min_p=0.05, seed=4),
         SamplingParams(temperature=1.0, presence_penalty=0.5, seed=5)]  # fmt: skip


def run_sampler(steps: int = 30) -> list[list[int]]:
    gens = [make_generator(p.seed) for p in KINDS]
    out: list[list[int]] = [[] for _ in KINDS]
    for step in range(steps):
        x = logits(len(KINDS), 500, seed=100 + step)
        x[2, step % 7] = NAN if step == 3 else x[2, step % 7]  # a row the kernel leaves to torch, once
        rows = [SamplingRow(p, g, [1, 2], out[i][-4:]) for i, (p, g) in enumerate(zip(KINDS, gens, strict=True))]
        for i, result in enumerate(sample(x, rows, {0})):
            out[i].append(result.token_id)
    return out


def test_the_sampler_gives_the_same_tokens_with_and_without_the_kernel(kernels, monkeypatch) -> None:
    with_kernel = run_sampler()
    monkeypatch.setattr(sampler, "load_cpu_kernels", lambda: None)
    assert run_sampler() == with_kernel


def test_parameters_float32_cannot_hold_go_to_torch_without_an_error(kernels) -> None:
    """A top-p of 1e-50 leaves float32's range, and so would a temperature of 1e-300 or 1e300 (SamplingParams refuses
    those; set after construction here, so the sampler's own guard is what is tested)."""
    params = [SamplingParams(seed=1), SamplingParams(seed=2),
              SamplingParams(top_p=1e-50, seed=3), SamplingParams(temperature=0.8, seed=4)]  # fmt: skip
    params[0].temperature, params[1].temperature = 1e-300, 1e300
    rows = [SamplingRow(p, make_generator(p.seed), [1], []) for p in params]
    tokens = [result.token_id for result in sample(logits(4, 300), rows, {0})]
    assert all(0 <= token < 300 for token in tokens)
