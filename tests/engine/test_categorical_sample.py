"""The compiled inverse-CDF draw with temperature, top-k, top-p and min-p (pagedllm/csrc/sampling_ops.cpp) against
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
               {"top_k": 20, "top_p": 0.5}, {"top_k": 5, "top_p": 0.8, "min_p": 0.05}, {"top_k": 100_000}]  # fmt: skip


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
