import math

import pytest
import torch

from pagedllm.engine.sampler import (
    SamplingRow,
    apply_penalties,
    beam_candidates,
    make_generator,
    sample,
)
from pagedllm.sampling_params import SamplingParams

V = 32
EOS = {3}


def row(params: SamplingParams | None = None, gen=None, prompt=(), output=()) -> SamplingRow:
    return SamplingRow(params or SamplingParams(), gen, list(prompt), list(output))


def rand_logits(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_and_logprob_is_raw():
    logits = rand_logits(4)
    rows = [row(SamplingParams(temperature=0, logprobs=3)) for _ in range(4)]
    results = sample(logits, rows, EOS)
    raw = torch.log_softmax(logits, -1)
    for i, r in enumerate(results):
        assert r.token_id == int(logits[i].argmax())
        assert r.logprob == pytest.approx(float(raw[i].max()), abs=1e-6)
        top = raw[i].topk(3)
        assert r.top_logprobs == pytest.approx(dict(zip(top.indices.tolist(), top.values.tolist())), abs=1e-6)


def test_logit_bias_moves_the_pick_but_not_the_reported_logprob():
    logits = rand_logits(4, seed=3)
    raw = torch.log_softmax(logits, -1)
    best = logits.argmax(-1).tolist()
    second = logits.topk(2).indices[:, 1].tolist()
    rows = [row(SamplingParams(temperature=0, logit_bias={7: 100.0})),  # forced to 7
            row(SamplingParams(temperature=0, logit_bias={best[1]: -100.0})),  # its argmax banned: the runner-up
            row(SamplingParams(temperature=0)),  # no bias: untouched beside the others
            row(SamplingParams(temperature=1.0, logit_bias={11: 100.0, 12: 0.5}), make_generator(4))]
    results = sample(logits, rows, EOS)
    assert [r.token_id for r in results] == [7, second[1], best[2], 11]
    for i, r in enumerate(results):  # the model's own logprob of what was picked, as vLLM reports it
        assert r.logprob == pytest.approx(float(raw[i, r.token_id]), abs=1e-6)


def test_allowed_token_ids_bound_the_pick_but_not_the_reported_logprob():
    logits = rand_logits(3, seed=5)
    raw = torch.log_softmax(logits, -1)
    allowed = [2, 9, 20]
    rows = [row(SamplingParams(temperature=0, allowed_token_ids=allowed)),
            row(SamplingParams(temperature=0)),  # untouched beside the others
            row(SamplingParams(temperature=2.0, allowed_token_ids=allowed, logit_bias={9: -100.0}), make_generator(2))]
    for _ in range(20):
        results = sample(logits, rows, EOS)
        assert results[0].token_id == allowed[int(logits[0, allowed].argmax())]
        assert results[1].token_id == int(logits[1].argmax())
        assert results[2].token_id in (2, 20)
        for i, r in enumerate(results):
            assert r.logprob == pytest.approx(float(raw[i, r.token_id]), abs=1e-6)


def test_logprobs_ignore_temperature_and_none_when_not_asked():
    logits = rand_logits(2)
    rows = [row(SamplingParams(temperature=5.0, logprobs=0), make_generator(1)), row()]
    a, b = sample(logits, rows, EOS)
    assert a.logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[a.token_id]), abs=1e-6)
    assert a.top_logprobs == {} and b.top_logprobs is None


def test_top_k_one_equals_greedy():
    logits = rand_logits(3)
    rows = [row(SamplingParams(top_k=1), make_generator(i)) for i in range(3)]
    assert [r.token_id for r in sample(logits, rows, EOS)] == logits.argmax(-1).tolist()


def test_top_p_and_min_p_restrict_support():
    logits = torch.full((1, V), -10.0)
    logits[0, 5], logits[0, 6], logits[0, 7] = 5.0, 4.0, 0.0  # probs ~ .73, .27, .005
    gen = make_generator(0)

    def support(params: SamplingParams, draws: int = 300) -> set[int]:
        return {sample(logits, [row(params, gen)], EOS)[0].token_id for _ in range(draws)}

    assert support(SamplingParams(top_p=0.7)) == {5}
    assert support(SamplingParams(top_p=0.9)) == {5, 6}
    assert support(SamplingParams(min_p=0.5)) == {5}  # p6 / p5 = e^-1 < 0.5
    assert support(SamplingParams(min_p=0.3)) == {5, 6}
    assert support(SamplingParams(top_k=2, temperature=3.0)) == {5, 6}
    assert support(SamplingParams(top_p=1e-50)) == {5}  # 0 in float32: the torch path still keeps the first token


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2] + [1e-12] * (V - 3)]))
    gen = make_generator(123)
    draws = [sample(logits, [row(SamplingParams(), gen)], EOS)[0].token_id for _ in range(2000)]
    freq = [draws.count(t) / len(draws) for t in range(3)]
    assert freq == pytest.approx([0.5, 0.3, 0.2], abs=0.04)


@pytest.mark.parametrize(
    "params, other",
    [
        (SamplingParams(temperature=0.9, top_p=0.95, top_k=20, seed=7), SamplingParams(temperature=1.3)),
        (SamplingParams(temperature=0.8, min_p=0.05, seed=7), SamplingParams(top_p=0.5, presence_penalty=1.0)),
    ],
)
def test_seeded_row_is_independent_of_batch(params, other):

    def run(batch_extra: int) -> list[int]:
        gen = make_generator(7)
        out = []
        for step in range(20):
            logits = rand_logits(1 + batch_extra, seed=step)
            others = [row(other, output=[step, 1]) for _ in range(batch_extra)]
            # the seeded row sits in the middle of the batch, with other rows around it
            logits[[0, batch_extra // 2]] = logits[[batch_extra // 2, 0]]
            rows = others[: batch_extra // 2] + [row(params, gen)] + others[batch_extra // 2 :]
            out.append(sample(logits, rows, EOS)[batch_extra // 2].token_id)
        return out

    alone = run(0)
    assert run(3) == alone and run(6) == alone
    assert len(set(alone)) > 1


def test_make_generator_streams_differ_per_index():
    assert make_generator(None) is None
    a = torch.rand(4, generator=make_generator(5, 0))
    b = torch.rand(4, generator=make_generator(5, 1))
    assert not torch.equal(a, b)
    assert torch.equal(a, torch.rand(4, generator=make_generator(5, 0)))


def test_repetition_penalty_divides_positive_and_multiplies_negative():
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0] + [0.0] * (V - 4)])
    r = row(SamplingParams(repetition_penalty=2.0), prompt=[0], output=[1])
    out = apply_penalties(logits.clone(), [r])
    assert out[0, :4].tolist() == [1.0, -4.0, 2.0, -2.0]


def test_presence_and_frequency_penalties_use_output_only():
    logits = torch.zeros(2, V)
    rows = [
        row(SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), prompt=[4], output=[1, 1, 2]),
        row(),  # untouched
    ]
    out = apply_penalties(logits.clone(), rows)
    assert out[0, :5].tolist() == [0.0, -2.0, -1.5, 0.0, 0.0]
    assert torch.equal(out[1], torch.zeros(V))


def test_penalty_changes_greedy_choice():
    logits = torch.zeros(1, V)
    logits[0, 9], logits[0, 10] = 2.0, 1.5
    params = SamplingParams(temperature=0, repetition_penalty=1.5)
    assert sample(logits, [row(params, output=[9])], EOS)[0].token_id == 10


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.zeros(1, V)
    logits[0, 3], logits[0, 8], logits[0, 2] = 9.0, 8.0, 1.0
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[8])
    assert sample(logits, [row(params, output=[1])], EOS)[0].token_id == 2
    assert sample(logits, [row(params, output=[1, 1])], EOS)[0].token_id == 3


def test_min_tokens_holds_eos_back_under_ignore_eos_too_as_vllm_does():
    logits = torch.zeros(1, V)
    eos = next(iter(EOS))
    logits[0, eos], logits[0, 5] = 9.0, 1.0
    params = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)
    assert sample(logits, [row(params, output=[1])], EOS)[0].token_id == 5
    assert sample(logits, [row(params, output=[1, 1])], EOS)[0].token_id == eos  # past min_tokens: EOS ends nothing


def test_beam_candidates_topk_over_all_beams():
    logits = rand_logits(3)
    cum = torch.tensor([-1.0, -0.5, -3.0])
    c = beam_candidates(logits, cum, k=4)
    total = torch.log_softmax(logits, -1) + cum[:, None]
    best = total.flatten().topk(4)
    assert c.cum_logprobs == pytest.approx(best.values.tolist())
    assert [p * V + t for p, t in zip(c.parents, c.token_ids)] == best.indices.tolist()
    assert all(math.isfinite(x) for x in c.cum_logprobs)
