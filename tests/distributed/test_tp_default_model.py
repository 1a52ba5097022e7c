"""The default model (9 query heads, 3 KV heads) split over 3 ranks gives the same greedy tokens."""

import pytest
from tp_helpers import completions, make_llm, same_completions

from pagedllm import SamplingParams

PROMPTS = ["The capital of France is", "PagedAttention is", "def fibonacci(n):", "Once upon a time"]


@pytest.mark.slow
def test_size_3_on_the_default_model_equals_size_1(default_model_path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24)
    options = dict(num_blocks=256, block_size=16)
    expected = completions(make_llm(default_model_path, 1, **options), PROMPTS, params)
    llm = make_llm(default_model_path, 3, **options)
    try:
        assert llm.engine.runner.config.num_heads == 3 and llm.engine.runner.config.num_kv_heads == 1
        assert same_completions(completions(llm, PROMPTS, params), expected)
    finally:
        llm.engine.shutdown()
