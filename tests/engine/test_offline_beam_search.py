"""LLM.beam_search with BeamSearchParams, vLLM's offline beam search call: the engine's own search (generate with
use_beam_search) in vLLM's output shapes, whatever the prompts' form and the concurrency limit."""

import pytest

from pagedllm import BeamSearchParams
from pagedllm.entrypoints.llm import LLM
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

PROMPTS = [[5, 17, 42, 99, 7], "hello there", {"prompt_token_ids": [8, 9, 10, 11]}]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), num_blocks=128, block_size=4, dtype="float32")


def test_the_beams_are_the_engines_own_search_in_vllms_shapes(llm):
    beams = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=3, max_tokens=6))
    offline = llm.generate(PROMPTS, SamplingParams(use_beam_search=True, n=3, max_tokens=6, temperature=0.0),
                           use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    assert len(beams) == len(PROMPTS)
    for result, output in zip(beams, offline):
        assert len(result.sequences) == 3
        for sequence, beam in zip(result.sequences, output.outputs):
            assert sequence.tokens == output.prompt_token_ids + beam.token_ids  # the prompt first, as vLLM's
            # the same search over the same tokens; its second run may add the logprobs in another rounding (the
            # prefix cache serves the prompt, batches differ)
            assert sequence.cum_logprob == pytest.approx(beam.cumulative_logprob, abs=1e-4)
            assert sequence.text == tokenizer.decode(sequence.tokens, skip_special_tokens=True)
            assert (sequence.finish_reason, sequence.stop_reason) == (beam.finish_reason, beam.stop_reason)
        scores = [s.cum_logprob / (len(s.tokens) - len(output.prompt_token_ids)) for s in result.sequences]
        assert scores == sorted(scores, reverse=True)  # best first (length penalty 1 over the output's length)


def test_a_concurrency_limit_and_temperature_1_give_the_same_beams(llm):
    params = BeamSearchParams(beam_width=2, max_tokens=5)
    whole = llm.beam_search(PROMPTS, params)
    one_at_a_time = llm.beam_search(PROMPTS, params, concurrency_limit=1)
    at_one = llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=5, temperature=1.0))
    tokens = [[s.tokens for s in r.sequences] for r in whole]
    assert [[s.tokens for s in r.sequences] for r in one_at_a_time] == tokens
    assert [[s.tokens for s in r.sequences] for r in at_one] == tokens
    (single,) = llm.beam_search("hello there", params)  # one prompt, as generate takes it
    assert single.sequences[0].tokens == whole[1].sequences[0].tokens


@pytest.mark.parametrize("call,match", [
    (lambda llm: llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=4, temperature=0.5)),
     "temperature must be 0 or 1"),
    (lambda llm: llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=4,
                                                            structured_outputs={"choice": ["a"]})),
     "structured_outputs is not supported"),
    (lambda llm: llm.beam_search(PROMPTS, SamplingParams(max_tokens=4)), "params must be a BeamSearchParams"),
    (lambda llm: llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=4), concurrency_limit=0),
     "concurrency_limit must be a positive integer"),
    (lambda llm: llm.beam_search(PROMPTS, BeamSearchParams(beam_width=0, max_tokens=4)), "beam_width"),
])
def test_what_the_search_cannot_do_is_refused_and_leaves_nothing_queued(llm, call, match):
    with pytest.raises(InvalidInputError, match=match):
        call(llm)
    assert not llm.engine.has_unfinished_requests()
