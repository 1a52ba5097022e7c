"""Tensor parallelism on the CPU (gloo): sizes 2 and 3 give what size 1 gives, on tiny models."""

import pytest
import torch
from tp_helpers import completions, make_llm, rounding_flips, recorded_draws, same_completions

from pagedllm import SamplingParams
from pagedllm.engine.model_runner import SeqInput
from pagedllm.errors import InvalidInputError

PROMPTS = ["Hello world", "PagedAttention stores the KV cache in blocks", "The quick brown fox", "0123"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def single(tiny_llama_dir):
    return make_llm(tiny_llama_dir, 1)


@pytest.fixture(scope="module")
def pair(tiny_llama_dir):
    llm = make_llm(tiny_llama_dir, 2)
    yield llm
    llm.engine.shutdown()


def _logits(llm, seqs: list[SeqInput]) -> torch.Tensor:
    return llm.engine.executor.execute([], seqs, [False] * sum(s.needs_logits for s in seqs)).full


def test_size_2_logits_are_size_1s_within_1e_4(single, pair) -> None:
    prefill = [SeqInput([5, 17, 99, 3, 250, 8], 0, [0, 1]), SeqInput([7, 7, 300], 0, [2])]
    decode = [SeqInput([42], 6, [0, 1]), SeqInput([11], 3, [2])]
    for step in (prefill, decode):  # the decode step reads what the prefill wrote into each rank's pool
        a, b = _logits(single, step), _logits(pair, step)
        assert a.shape == b.shape == (2, 384)
        torch.testing.assert_close(b, a, atol=1e-4, rtol=0)


def test_size_2_greedy_tokens_equal_size_1(single, pair) -> None:
    long_prompts = [[(7 * i + j) % 380 + 3 for j in range(300)] for i in range(16)]  # several to a step
    for prompts in (PROMPTS, long_prompts):
        assert same_completions(completions(pair, prompts, GREEDY), completions(single, prompts, GREEDY))


def test_size_2_prompt_logprobs_are_size_1s(single, pair) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=3)
    one, two = (llm.generate(PROMPTS, params, use_tqdm=False) for llm in (single, pair))
    for a, b in zip(one, two):
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs) == len(a.prompt_token_ids)
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
            assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert list(x.top.values()) == pytest.approx(list(y.top.values()), abs=1e-4)


def test_size_2_applies_logit_bias_as_size_1(single, pair) -> None:
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={77: 100.0}),
              SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={5: 3.0, 9: -100.0})]
    one, two = (completions(llm, PROMPTS[:2], params) for llm in (single, pair))
    assert one[0][0][0] == [77] * 6  # the biased row's pick: forced
    assert same_completions(two, one)


def test_size_2_bans_bad_words_as_size_1(single, pair) -> None:
    free = completions(single, PROMPTS[:1], GREEDY)[0][0][0]
    tokenizer = single.get_tokenizer()
    texts = [tokenizer.decode([t]).lstrip() for t in free]
    encodes = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    word = next(text for t, text, ids in zip(free, texts, encodes) if ids == [t])  # written unasked, reads as itself
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, bad_words=[word])
    one, two = (completions(llm, PROMPTS[:1], params) for llm in (single, pair))
    assert one[0][0][0] != free
    assert same_completions(two, one)


def test_one_tensor_parallel_engine_per_process(tiny_llama_dir, pair) -> None:
    with pytest.raises(InvalidInputError, match="already running in this process"):
        make_llm(tiny_llama_dir, 2)


def test_prefix_caching_parallel_sampling_and_beam_search_under_size_2(single, pair) -> None:
    shared = "PagedAttention stores the KV cache in fixed-size blocks of one preallocated pool. " * 2
    prompts = [shared + "Each sequence", shared + "Continuous batching"]
    sampled = SamplingParams(n=4, temperature=0.8, top_p=0.9, seed=7, max_tokens=12, logprobs=2)
    beams = SamplingParams(use_beam_search=True, beam_width=4, n=2, temperature=0.0, max_tokens=10)
    for params in (GREEDY, sampled, beams):
        for llm in (single, pair):
            completions(llm, prompts[:1], params)  # warms the prefix cache
        outs, draws = [], []
        for llm in (single, pair):
            with recorded_draws() as recorded:
                outs.append(llm.generate(prompts, params, use_tqdm=False))
            draws.append(recorded)
        assert all(o.metrics.num_cached_prompt_tokens > 0 for out in outs for o in out)
        assert (len(draws[0].tokens) > 0) == (params is sampled)  # greedy and beam search draw nothing
        # the logits may differ by the reduction order's rounding (1e-4, above), scaled by the temperature
        if rounding_flips(draws[0], draws[1], logits_tol=1e-4 / sampled.temperature) == 0:
            got = [[[(c.token_ids, c.cumulative_logprob) for c in o.outputs] for o in out] for out in outs]
            assert same_completions(got[1], got[0])
