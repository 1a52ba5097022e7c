"""The compiled inverse-CDF draw for rows that only scale by a temperature (pagedllm/csrc/sampling_ops.cpp) against
the sampler's torch path, and the sampler's tokens with it against its tokens without it."""

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


def torch_draws(x: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return sampler._inverse_cdf((x / temperature[:, None]).softmax(dim=-1), u)


def near_a_boundary(x: torch.Tensor, temperature: torch.Tensor, u: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Rows whose u lies within 1e-9 of the normalised CDF at the token or the one before it: there float rounding
    may pick either neighbour."""
    cdf = (x.double() / temperature.double()[:, None]).softmax(dim=-1).cumsum(dim=-1)
    at = cdf.gather(1, token[:, None]).squeeze(1)
    before = cdf.gather(1, (token - 1).clamp(min=0)[:, None]).squeeze(1)
    return ((at - u).abs() < 1e-9) | ((before - u).abs() < 1e-9)


@pytest.mark.parametrize("vocab", [1, 7, 16, 65, 1000, 49152])
def test_draws_equal_the_torch_paths(kernels, vocab: int) -> None:
    x = logits(64, vocab, seed=vocab)
    x[5, : vocab // 2] = -INF  # masked tokens
    temperature = torch.rand(64, generator=torch.Generator().manual_seed(1)) * 2 + 0.05
    u = torch.rand(64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    u[0], u[1] = 0.0, 1.0 - 2**-53  # both ends of [0, 1)
    got, expected = kernels.categorical_sample(x, temperature, u), torch_draws(x, temperature, u)
    assert got.dtype == torch.int64 and got.shape == (64,)
    differs = got != expected
    assert not differs[~near_a_boundary(x, temperature, u, expected)].any()
    assert (x.gather(1, got[:, None]) > -INF).all()  # never a masked token


def test_every_token_is_reachable_and_drawn_as_often_as_its_probability(kernels) -> None:
    x = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).repeat(4000, 1)
    u = torch.rand(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    tokens = kernels.categorical_sample(x, torch.ones(4000), u)
    freq = torch.bincount(tokens, minlength=4).double() / 4000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64), atol=0.03, rtol=0)


def test_a_nan_or_no_finite_maximum_is_left_to_the_caller(kernels) -> None:
    x = logits(5, 40)
    x[1, 3], x[2, :], x[3, 7] = NAN, -INF, INF
    tokens = kernels.categorical_sample(x, torch.ones(5), torch.full((5,), 0.5, dtype=torch.float64))
    assert tokens.tolist()[1:4] == [-1, -1, -1] and tokens[0] >= 0 and tokens[4] >= 0


@pytest.mark.parametrize("temperature, u, message", [(0.0, 0.5, "positive"), (1.0, 1.0, "u in"), (1.0, -0.1, "u in")])
def test_bad_temperatures_and_uniforms_are_refused(kernels, temperature: float, u: float, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        kernels.categorical_sample(logits(1, 10), torch.tensor([temperature]), torch.tensor([u], dtype=torch.float64))


def test_wrong_dtypes_and_shapes_are_refused(kernels) -> None:
    x, t, u = logits(2, 10), torch.ones(2), torch.full((2,), 0.5, dtype=torch.float64)
    for args in [(x.double(), t, u), (x, t.double(), u), (x, t, u.float()), (x, t[:1], u), (x.t(), t, u)]:
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
