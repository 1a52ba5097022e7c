import pytest

from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams


def test_defaults_match_openai():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens) == (1, 1.0, 1.0, 0, 16)
    assert p.stop == [] and p.stop_token_ids == [] and p.logprobs is None
    assert not p.greedy and not p.has_penalties and p.beam_width is None


def test_stop_accepts_a_single_string():
    assert SamplingParams(stop="\n\n").stop == ["\n\n"]


def test_top_k_minus_one_means_off():
    p = SamplingParams(top_k=-1)
    assert p.top_k == 0 and not p.top_k_enabled


def test_greedy_and_int_temperature():
    p = SamplingParams(temperature=0)
    assert p.greedy and isinstance(p.temperature, float)


def test_beam_width_defaults_to_n():
    p = SamplingParams(n=3, use_beam_search=True, temperature=0.0)
    assert p.beam_width == 3 and p.greedy


def test_stop_ids_include_eos_unless_ignored():
    assert SamplingParams(stop_token_ids=[7]).stop_ids({2}) == {2, 7}
    assert SamplingParams(stop_token_ids=[7], ignore_eos=True).stop_ids({2}) == {7}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n": 0}, "n"),
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.1}, "min_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"repetition_penalty": 1e-50}, "repetition_penalty"),  # 0 in float32: seen logits would turn infinite
        ({"repetition_penalty": float("inf")}, "repetition_penalty"),
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"seed": 1.5}, "seed"),
        ({"temperature": "hot"}, "temperature"),
        ({"beam_width": 2}, "beam_width"),
        ({"length_penalty": 0.5}, "length_penalty"),
        ({"use_beam_search": True}, "temperature"),
        ({"use_beam_search": True, "temperature": 0, "beam_width": 0}, "beam_width"),
        ({"use_beam_search": True, "temperature": 0, "n": 3, "beam_width": 2}, "beam_width"),
        ({"use_beam_search": True, "temperature": 0, "top_k": 5}, "top_k"),
        ({"use_beam_search": True, "temperature": 0, "early_stopping": "always"}, "early_stopping"),
        ({"top_k": 2**63}, "top_k"),
        ({"temperature": 1e-45}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"stop": 5}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"stop_token_ids": 5}, "stop_token_ids"),
        ({"ignore_eos": "no"}, "ignore_eos"),
        ({"use_beam_search": "yes"}, "use_beam_search"),
        ({"skip_special_tokens": 0}, "skip_special_tokens"),
        ({"use_beam_search": True, "temperature": 0, "length_penalty": float("-inf")}, "length_penalty"),
        # what beam search does not apply is refused, not ignored
        ({"use_beam_search": True, "temperature": 0, "stop": ["\n"]}, "stop"),
        ({"use_beam_search": True, "temperature": 0, "logprobs": 2}, "logprobs"),
        ({"use_beam_search": True, "temperature": 0, "presence_penalty": 2.0}, "presence_penalty"),
        ({"use_beam_search": True, "temperature": 0, "logit_bias": {5: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: 100.5}}, "logit_bias"), ({"logit_bias": {5: float("nan")}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"), ({"logit_bias": {"5": 1.0}}, "logit_bias"),
        ({"logit_bias": {5: "1"}}, "logit_bias"), ({"logit_bias": [5]}, "logit_bias"),
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"detokenize": 0}, "detokenize"), ({"detokenize": False, "stop": ["."]}, "stop"),
        ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"), ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": 2.0}, "truncate_prompt_tokens"),
        ({"allowed_token_ids": []}, "allowed_token_ids"), ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
        ({"allowed_token_ids": 5}, "allowed_token_ids"), ({"allowed_token_ids": [1.5]}, "allowed_token_ids"),
        ({"use_beam_search": True, "temperature": 0, "allowed_token_ids": [5]}, "allowed_token_ids"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(InvalidInputError, match=field):
        SamplingParams(**kwargs)


def test_max_tokens_none_is_allowed():
    assert SamplingParams(max_tokens=None, min_tokens=100).max_tokens is None


def test_early_stopping_never_is_allowed():
    p = SamplingParams(use_beam_search=True, temperature=0, early_stopping="never", length_penalty=0.5)
    assert p.early_stopping == "never"


def test_a_stop_token_that_is_the_eos_under_ignore_eos_reports_its_id():
    """With ignore_eos, an EOS listed in stop_token_ids stops as a stop token: vLLM reports its id."""
    assert SamplingParams(ignore_eos=True, stop_token_ids=[2]).stop_reason(2, 2) == 2
    assert SamplingParams().stop_reason(2, 2) is None


def test_bounds_are_inclusive():
    """truncate_prompt_tokens up to the model length, min_tokens up to max_tokens, 20 logprobs, a bias of -100."""
    assert SamplingParams(truncate_prompt_tokens=4).truncated_prompt(list(range(10)), 4) == [6, 7, 8, 9]
    assert SamplingParams(min_tokens=5, max_tokens=5).min_tokens == 5
    p = SamplingParams(logprobs=20, prompt_logprobs=20)
    assert (p.logprobs, p.prompt_logprobs) == (20, 20)
    assert SamplingParams(logit_bias={5: -100}).logit_bias == {5: -100}


@pytest.mark.parametrize("value", [-100.5, -1e9])
def test_a_logit_bias_below_minus_100_is_refused(value):
    with pytest.raises(InvalidInputError, match="logit_bias"):
        SamplingParams(logit_bias={5: value})
