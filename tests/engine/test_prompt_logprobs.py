"""SamplingParams.prompt_logprobs against transformers' teacher-forced log-softmax, however the prompt is computed:
chunked, batched with other requests, behind a cached prefix, recomputed after a preemption."""

import pytest
import torch
from test_engine import GREEDY, hf_model, make_engine, random_prompts, run_all  # noqa: F401  (hf_model: fixture)

from pagedllm.engine.model_runner import SeqInput
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

K = 3


def hf_prompt_logprobs(hf_model, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab]: row p is the log-softmax that gives prompt token p + 1."""
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([prompt])).logits[0, :-1].float(), dim=-1)


def check_against_transformers(hf_model, prompt: list[int], entries) -> None:
    want = hf_prompt_logprobs(hf_model, prompt)
    assert len(entries) == len(prompt) and entries[0] is None
    for position, entry in enumerate(entries[1:]):
        assert entry.token_id == prompt[position + 1]
        assert entry.logprob == pytest.approx(want[position, entry.token_id].item(), abs=1e-4)
        top_values, top_ids = want[position].topk(K)
        assert list(entry.top) == top_ids.tolist()
        assert list(entry.top.values()) == pytest.approx(top_values.tolist(), abs=1e-4)
        check_rank(want[position], entry)


def check_rank(logprobs: torch.Tensor, entry) -> None:
    """The entry's rank is vLLM's count of tokens at least as likely as its own (transformers' logprobs give
    the count within their 1e-4 of the engine's), and its vLLM-shaped view holds the token, then the top-k."""
    value = logprobs[entry.token_id].item()
    assert int((logprobs >= value + 1e-4).sum()) < entry.rank <= int((logprobs >= value - 1e-4).sum())
    view = dict(entry)
    assert list(view) == [entry.token_id] + [t for t in entry.top if t != entry.token_id]
    assert (view[entry.token_id].logprob, view[entry.token_id].rank) == (entry.logprob, entry.rank)
    assert [view[t].rank for t in entry.top] == list(range(1, len(entry.top) + 1))


@pytest.mark.parametrize("budget", [512, 7])  # whole prompts; chunks of 7 tokens across steps
def test_prompt_logprobs_match_transformers_batched_and_chunked(tiny_llama_dir, hf_model, budget):
    prompts = random_prompts(4, seed=11, low=20, high=50)
    params = [SamplingParams(max_tokens=3, prompt_logprobs=K, **GREEDY), SamplingParams(max_tokens=3, **GREEDY)] * 2
    outputs = run_all(make_engine(tiny_llama_dir, max_num_batched_tokens=budget), prompts, params)
    for prompt, out in zip(prompts[::2], outputs[::2]):
        check_against_transformers(hf_model, prompt, out.prompt_logprobs)
    assert all(out.prompt_logprobs is None for out in outputs[1::2])


def test_a_cached_prefix_still_gets_every_prompt_logprob(tiny_llama_dir, hf_model):
    engine = make_engine(tiny_llama_dir)
    prompt = random_prompts(1, seed=12, low=40, high=40)[0]
    run_all(engine, [prompt], SamplingParams(max_tokens=2, **GREEDY))  # fills the prefix cache
    (out,) = run_all(engine, [prompt], SamplingParams(max_tokens=2, prompt_logprobs=K, **GREEDY))
    check_against_transformers(hf_model, prompt, out.prompt_logprobs)
    assert out.metrics.num_cached_prompt_tokens == 0  # it computed its whole prompt
    (again,) = run_all(engine, [prompt], SamplingParams(max_tokens=2, **GREEDY))
    assert again.metrics.num_cached_prompt_tokens == 36  # and left its blocks in the cache for others


@pytest.mark.parametrize("budget", [9, 5])  # chunks that end mid-block either way
def test_a_recomputed_prompt_adds_no_second_entry(tiny_llama_dir, hf_model, budget):
    engine = make_engine(tiny_llama_dir, num_blocks=12, max_num_batched_tokens=budget)
    short, long = random_prompts(1, seed=0, low=4, high=4)[0], random_prompts(1, seed=1, low=40, high=40)[0]
    params = [SamplingParams(max_tokens=30, **GREEDY), SamplingParams(max_tokens=2, prompt_logprobs=K, **GREEDY)]
    outputs = run_all(engine, [short, long], params)
    assert outputs[1].metrics.num_preemptions == 1  # preempted mid-prompt, then readmitted
    check_against_transformers(hf_model, long, outputs[1].prompt_logprobs)


@pytest.mark.parametrize("extra", [dict(n=3, temperature=1.0, seed=5), dict(use_beam_search=True, n=2, temperature=0)])
def test_prompt_logprobs_with_several_completions_or_beams(tiny_llama_dir, hf_model, extra):
    prompt = random_prompts(1, seed=13, low=30, high=30)[0]
    (out,) = run_all(make_engine(tiny_llama_dir), [prompt], SamplingParams(max_tokens=4, prompt_logprobs=K, **extra))
    check_against_transformers(hf_model, prompt, out.prompt_logprobs)
    assert len(out.outputs) == extra["n"]


def test_a_one_token_prompt_has_only_the_leading_none(tiny_llama_dir):
    (out,) = run_all(make_engine(tiny_llama_dir), [[7]], SamplingParams(max_tokens=2, prompt_logprobs=0, **GREEDY))
    assert out.prompt_logprobs == [None]


def test_prompt_logprobs_zero_gives_no_alternatives(tiny_llama_dir, hf_model):
    prompt = random_prompts(1, seed=14, low=10, high=10)[0]
    (out,) = run_all(make_engine(tiny_llama_dir), [prompt], SamplingParams(max_tokens=1, prompt_logprobs=0, **GREEDY))
    assert all(entry.top == {} for entry in out.prompt_logprobs[1:])


@pytest.mark.parametrize("value", [-1, 21, 1.5, "3"])
def test_prompt_logprobs_out_of_range_are_refused(value):
    with pytest.raises(InvalidInputError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=value)


def test_the_runner_refuses_prompt_rows_outside_the_new_tokens(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(InvalidInputError, match="prompt_logits"):
        engine.executor.runner.execute([SeqInput([5, 6, 7], 0, [0], True, range(1, 4))])
