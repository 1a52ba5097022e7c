"""Which rows the LM head's greedy pass may serve, on any CPU: the head is made to pick as the AMX one does
(each row's argmax and its raw logprob), and a step whose rows need more than that (logprobs, a logit bias,
penalties, bad words, a grammar, beams) must still get full logits and give the tokens and logprobs of an engine
without the pass."""

import pytest
import torch
from test_engine import GREEDY, make_engine, run_all

from pagedllm.sampling_params import SamplingParams

PROMPT = [5, 6, 7, 8]


def with_greedy_head(engine) -> list[int]:
    """Give the model a greedy pass; the list it returns counts the rows each call served."""
    model = engine.runner.model
    served: list[int] = []

    def picks(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs = torch.log_softmax(model.compute_logits(hidden).float(), dim=-1)
        values, tokens = logprobs.max(dim=-1)
        served.append(len(tokens))
        return tokens, values

    model.greedy_picks = picks
    return served


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=4, logprobs=2, **GREEDY),
    SamplingParams(max_tokens=4, logit_bias={9: 100.0}, **GREEDY),
    SamplingParams(max_tokens=4, repetition_penalty=1e6, **GREEDY),
    SamplingParams(max_tokens=4, bad_words=["the"], **GREEDY),
    SamplingParams(max_tokens=4, structured_outputs={"regex": "[a-z]{3}"}, **GREEDY),
    SamplingParams(max_tokens=4, n=2, use_beam_search=True, temperature=0.0, ignore_eos=True),
], ids=["logprobs", "logit_bias", "penalty", "bad_words", "structured_outputs", "beam"])  # fmt: skip
def test_rows_that_need_more_than_the_greedy_pick_get_full_logits(tiny_llama_dir, params):
    (want,) = run_all(make_engine(tiny_llama_dir), [PROMPT], params)
    engine = make_engine(tiny_llama_dir)
    served = with_greedy_head(engine)
    (got,) = run_all(engine, [PROMPT], params)
    assert served == []
    for a, b in zip(want.outputs, got.outputs, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs  # both None, or the same entries


def test_plain_greedy_rows_take_the_greedy_pass(tiny_llama_dir):
    params = SamplingParams(max_tokens=4, **GREEDY)
    (want,) = run_all(make_engine(tiny_llama_dir), [PROMPT], params)
    engine = make_engine(tiny_llama_dir)
    served = with_greedy_head(engine)
    (got,) = run_all(engine, [PROMPT], params)
    assert got.outputs[0].token_ids == want.outputs[0].token_ids and len(served) == 4
