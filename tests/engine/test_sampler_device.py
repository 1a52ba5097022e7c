"""Sampling where the logits are (the CPU here; also CUDA when torch sees one): every kind of row, seeded
rows reproducible whatever shares the batch, and one copy back per step."""

import pytest
import torch

from pagedllm.engine.device import record_transfers
from pagedllm.engine.sampler import SamplingRow, make_generator, sample
from pagedllm.sampling_params import SamplingParams

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
V = 64
KINDS = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=5),
    SamplingParams(temperature=1.2, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.1),
    SamplingParams(temperature=1.0, top_k=10, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=0.8, presence_penalty=0.7, repetition_penalty=1.3),
]


def logits_for(step: int, rows: int, device: str) -> torch.Tensor:
    return (torch.randn(rows, V, generator=torch.Generator().manual_seed(step)) * 3).to(device)


def run(kinds: list[int], device: str, steps: int = 12) -> list[list[int]]:
    """Tokens per row over `steps` steps; row r has params KINDS[kinds[r]] and its own seeded stream."""
    gens = [make_generator(100 + k, 0, device) for k in kinds]
    out: list[list[int]] = [[] for _ in kinds]
    for step in range(steps):
        # the row of kind k always sees the same logits, wherever it sits in the batch
        logits = torch.cat([logits_for(step * 100 + k, 1, device) for k in kinds])
        rows = [SamplingRow(KINDS[k], g, [1, 2], out[r][-3:]) for r, (k, g) in enumerate(zip(kinds, gens))]
        for r, result in enumerate(sample(logits, rows, {3})):
            out[r].append(result.token_id)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_each_row_samples_as_it_would_alone(device):
    kinds = list(range(len(KINDS)))
    together = run(kinds, device)
    alone = [run([k], device)[0] for k in kinds]
    assert together == alone
    reversed_batch = run(kinds[::-1], device)
    assert reversed_batch[::-1] == alone
    assert all(len(set(tokens)) > 1 for tokens in alone[1:])  # the random rows do vary


@pytest.mark.parametrize("device", DEVICES)
def test_greedy_rows_take_the_argmax(device):
    logits = logits_for(0, 4, device)
    rows = [SamplingRow(SamplingParams(temperature=0.0), None, [], []) for _ in range(4)]
    assert [r.token_id for r in sample(logits, rows, set())] == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_words_mask_their_tokens_where_the_logits_are(device):
    logits = logits_for(1, 2, device)
    best, second = logits.topk(2).indices.T.tolist()
    rows = [SamplingRow(SamplingParams(temperature=0.0), None, [], [7], [[best[0]]]),  # one token: always banned
            SamplingRow(SamplingParams(temperature=0.0), None, [], [7], [[7, best[1]]])]  # banned right after 7
    assert [r.token_id for r in sample(logits, rows, set())] == second


@pytest.mark.parametrize("device", DEVICES)
def test_one_copy_back_per_step_and_one_more_for_top_logprobs(device):
    logits = logits_for(1, 3, device)
    rows = [SamplingRow(KINDS[k], make_generator(1, k, device), [], []) for k in (0, 3, 5)]
    with record_transfers() as log:
        sample(logits, rows, set())
    assert [t.what for t in log if t.direction == "d2h"] == ["sampled tokens"]
    rows[1] = SamplingRow(SamplingParams(temperature=1.0, logprobs=3), make_generator(1, 9, device), [], [])
    with record_transfers() as log:
        results = sample(logits, rows, set())
    assert [t.what for t in log if t.direction == "d2h"] == ["sampled tokens", "top logprobs"]
    assert len(results[1].top_logprobs) == 3 and results[0].top_logprobs is None
