"""repetition_detection, as vLLM's: which outputs end in a repeated pattern, which params are refused, and the
engine's outputs cut where the detection says, with finish_reason "repetition"."""

import pytest
from test_engine import GREEDY, make_engine, random_prompts, run_all

from pagedllm import RepetitionDetectionParams
from pagedllm.errors import InvalidInputError
from pagedllm.repetition_detection import ends_in_repetition
from pagedllm.sampling_params import SamplingParams


def params(max_size: int, count: int, min_size: int = 0) -> RepetitionDetectionParams:
    return RepetitionDetectionParams(max_pattern_size=max_size, min_pattern_size=min_size, min_count=count)


def test_a_tail_repeating_a_pattern_min_count_times_is_found():
    assert ends_in_repetition([9, 1, 2, 3, 1, 2, 3], params(3, 2))
    assert not ends_in_repetition([9, 1, 2, 3, 1, 2, 3], params(3, 3))  # twice only
    assert ends_in_repetition([1, 2, 3, 1, 2, 3, 1, 2, 3], params(3, 3))
    assert ends_in_repetition([4, 7, 7, 7], params(1, 3))
    assert not ends_in_repetition([1, 2, 3, 1, 2, 3], params(2, 2))  # the pattern is longer than the largest size
    assert not ends_in_repetition([1, 2, 1, 2, 5], params(2, 2))  # not at the tail


def test_sizes_below_the_minimum_are_not_looked_at_and_sizes_stop_where_the_output_is_too_short():
    assert not ends_in_repetition([5, 7, 7], params(2, 2, min_size=2))
    assert ends_in_repetition([7, 8, 7, 8], params(2, 2, min_size=2))
    # vLLM stops at the first size that does not fit min_count times, however large max_pattern_size is
    assert not ends_in_repetition([1, 2, 3], params(1024, 2))
    assert not ends_in_repetition([7, 7], params(0, 0))  # off


@pytest.mark.parametrize("fields, message", [
    (dict(max_pattern_size=-1), "max_pattern_size must be an integer >= 0"),
    (dict(max_pattern_size=2, min_pattern_size=3, min_count=2), "min_pattern_size must be <= max_pattern_size"),
    (dict(max_pattern_size=2, min_count=1), "min_count must be >= 2"),
    (dict(max_pattern_size=1025, min_count=2), "max_pattern_size must be at most 1024"),
    (dict(max_pattern_size=True, min_count=2), "max_pattern_size must be an integer"),
])  # fmt: skip
def test_bad_params_are_refused(fields, message):
    with pytest.raises(InvalidInputError, match=message):
        SamplingParams(repetition_detection=fields)


def test_a_dict_becomes_the_params_and_beam_search_takes_none():
    got = SamplingParams(repetition_detection={"max_pattern_size": 4, "min_count": 3}).repetition_detection
    assert got == params(4, 3)
    with pytest.raises(InvalidInputError, match="takes max_pattern_size, min_pattern_size and min_count"):
        SamplingParams(repetition_detection={"max_pattern": 4})
    with pytest.raises(InvalidInputError, match="repetition_detection is not supported with use_beam_search"):
        SamplingParams(use_beam_search=True, n=2, temperature=0.0, repetition_detection=params(2, 2))


def first_repetition(output: list[int], detect: RepetitionDetectionParams, min_tokens: int) -> int | None:
    """How many tokens the output keeps: up to the first where detection fires."""
    return next((k for k in range(max(min_tokens, 1), len(output) + 1) if ends_in_repetition(output[:k], detect)),
                None)


@pytest.mark.parametrize("min_tokens", [0, 24])
def test_the_engine_ends_an_output_where_it_first_repeats_after_min_tokens(tiny_llama_dir, min_tokens):
    engine = make_engine(tiny_llama_dir)
    prompts = random_prompts(8, seed=3)
    free = [o.outputs[0].token_ids
            for o in run_all(engine, prompts, SamplingParams(max_tokens=48, min_tokens=min_tokens, **GREEDY))]
    detect = params(4, 3)
    cuts = [first_repetition(ids, detect, min_tokens) for ids in free]
    assert sum(cut is not None for cut in cuts) >= 2, "the tiny model should loop on some of these prompts"
    limited = SamplingParams(max_tokens=48, repetition_detection=detect, min_tokens=min_tokens, **GREEDY)
    for ids, cut, out in zip(free, cuts, run_all(engine, prompts, limited)):
        completion = out.outputs[0]
        if cut is None:
            assert completion.token_ids == ids and completion.finish_reason == "length"
        else:
            assert completion.token_ids == ids[:cut]
            assert (completion.finish_reason, completion.stop_reason) == ("repetition", "repetition_detected")
