"""thinking_token_budget: where a sequence's reasoning stands (ThinkingBudget over token ids), the tags an engine
goes by, and the engine's outputs: the model's own tokens up to the budget, then the forced end, then the model's
answer after it, as if the forced text had been in the prompt."""

import pytest
from test_bad_words import WordTokenizer
from test_engine import GREEDY, make_engine, random_prompts, run_all

from pagedllm.config import EngineConfig
from pagedllm.engine.sampler import SamplingRow, sample
from pagedllm.engine.thinking_budget import ThinkingBudget, ThinkTags, think_tags
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams

TAGS = ThinkTags(start=(90, 91), end=(92,), forced_end=(93, 94, 92))  # a two-token start, a three-token forced end


def forced_run(budget: ThinkingBudget, output: list[int], model_tokens: list[int]) -> list[int]:
    """Grow `output` a token at a time: the forced token where there is one, else the next of `model_tokens`."""
    model = iter(model_tokens)
    while True:
        forced = budget.forced_token(output)
        token = forced if forced is not None else next(model, None)
        if token is None:
            return output
        output.append(token)


def test_a_block_open_in_the_prompt_is_forced_closed_after_the_budget_counting_its_prompt_tokens():
    budget = ThinkingBudget(TAGS, 4, [5, 90, 91, 7])  # one reasoning token in the prompt already
    assert forced_run(budget, [], [10, 11, 12, 13, 14, 15]) == [10, 11, 12, 93, 94, 92, 13, 14, 15]


def test_a_block_opened_in_the_output_gets_the_budget_and_each_later_block_gets_it_again():
    budget = ThinkingBudget(TAGS, 2, [5, 6])
    out = forced_run(budget, [], [10, 90, 91, 11, 12, 13, 90, 91, 14, 15, 16])
    assert out == [10, 90, 91, 11, 12, 93, 94, 92, 13, 90, 91, 14, 15, 93, 94, 92, 16]


def test_a_block_the_model_ends_within_its_budget_is_not_forced():
    budget = ThinkingBudget(TAGS, 3, [90, 91])
    assert forced_run(budget, [], [10, 92, 11, 12, 13, 14]) == [10, 92, 11, 12, 13, 14]


def test_a_closed_block_in_the_prompt_is_not_reasoning_and_budget_zero_forces_at_once():
    assert forced_run(ThinkingBudget(TAGS, 0, [90, 91, 7, 92, 8]), [], [10, 11]) == [10, 11]
    assert forced_run(ThinkingBudget(TAGS, 0, [90, 91]), [], [10, 11]) == [93, 94, 92, 10, 11]
    assert forced_run(ThinkingBudget(TAGS, 0, [3]), [], [90, 91, 10]) == [90, 91, 93, 94, 92, 10]


def test_a_start_split_across_the_prompts_end_and_the_output_opens_a_block():
    budget = ThinkingBudget(TAGS, 1, [4, 90])
    assert forced_run(budget, [], [91, 10, 11]) == [91, 10, 93, 94, 92, 11]


def test_the_budget_takes_the_output_however_many_tokens_arrive_between_calls():
    budget = ThinkingBudget(TAGS, 2, [90, 91])
    assert budget.forced_token([10]) is None
    assert budget.forced_token([10, 11]) == 93  # two tokens taken at once
    assert budget.forced_token([10, 11, 93, 94]) == 92
    assert budget.forced_token([10, 11, 93, 94, 92]) is None


def test_the_tags_come_from_the_parser_and_the_config_overrides_the_start_and_the_forced_end():
    tok = WordTokenizer({"<think>": [1], "</think>": [2], "<r>": [3], "Stop.</think>": [4, 2], "<big>": [5, 60]})
    assert think_tags(None, None, tok, 50) is None
    assert think_tags("qwen3", None, tok, 50) == ThinkTags((1,), (2,), (2,))
    assert think_tags("qwen3", '{"reasoning_end_str": "Stop.</think>"}', tok, 50) == ThinkTags((1,), (2,), (4, 2))
    both = {"reasoning_start_str": "<r>", "reasoning_end_str": "Stop.</think>"}
    assert think_tags(None, both, tok, 50) == ThinkTags((3,), (4, 2), (4, 2))  # no parser: its end is the forced one
    assert think_tags(None, {"reasoning_end_str": "</think>"}, tok, 50) is None  # no start to go by
    with pytest.raises(InvalidInputError, match="'unknown' tokenizes to \\[\\]"):
        think_tags(None, {"reasoning_start_str": "<r>", "reasoning_end_str": "unknown"}, tok, 50)
    with pytest.raises(InvalidInputError, match="not tokens of the model's vocabulary of 50"):
        think_tags("qwen3", {"reasoning_end_str": "<big>"}, tok, 50)


@pytest.mark.parametrize("bad, message", [
    ("{not json", "must be a JSON object"), ("[1]", "must be a JSON object"),
    ({"reasoning_end": "x"}, "takes reasoning_start_str, reasoning_end_str"),
    ({"reasoning_end_str": ""}, "must be a non-empty string"),
])  # fmt: skip
def test_a_bad_reasoning_config_or_parser_is_refused_at_construction(bad, message):
    with pytest.raises(InvalidInputError, match=message):
        EngineConfig(reasoning_config=bad)
    with pytest.raises(InvalidInputError, match="reasoning_parser must be one of"):
        EngineConfig(reasoning_parser="harmony")


@pytest.mark.parametrize("value", [-2, 1.5, True, "3"])
def test_a_budget_that_is_not_an_integer_of_minus_one_or_more_is_refused(value):
    with pytest.raises(InvalidInputError, match="thinking_token_budget must be an integer >= 0"):
        SamplingParams(thinking_token_budget=value)


def test_minus_one_means_no_budget_and_beam_search_takes_none():
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None
    with pytest.raises(InvalidInputError, match="thinking_token_budget is not supported with use_beam_search"):
        SamplingParams(use_beam_search=True, n=2, temperature=0.0, thinking_token_budget=4)


def test_a_forced_row_picks_its_token_greedy_or_sampled_and_reports_the_models_logprob():
    import torch

    logits = torch.randn(2, 50)
    rows = [SamplingRow(SamplingParams(**params), None, [1], [], forced_token=7)
            for params in (dict(temperature=0.0, logprobs=1), dict(temperature=1.0, top_p=0.5, logprobs=1))]
    for i, result in enumerate(sample(logits.clone(), rows, set())):
        assert result.token_id == 7
        assert result.logprob == pytest.approx(float(logits[i].log_softmax(-1)[7]), abs=1e-5)


def tags_of(engine) -> ThinkTags:
    return engine.output_stage.think_tags


@pytest.mark.parametrize("budget", [0, 3, 7])
def test_the_engine_writes_the_models_tokens_up_to_the_budget_then_the_forced_end_then_the_answer(
        tiny_llama_dir, budget):
    config = {"reasoning_end_str": "The end.</think>"}
    engine = make_engine(tiny_llama_dir, reasoning_parser="qwen3", reasoning_config=config)
    tags = tags_of(engine)
    assert len(tags.start) > 1 and len(tags.forced_end) > 2  # the tiny tokenizer spells them in several tokens
    prompts = [p + list(tags.start) for p in random_prompts(3, seed=budget)]
    free = [o.outputs[0].token_ids for o in run_all(engine, prompts, SamplingParams(max_tokens=12, **GREEDY))]
    limited = SamplingParams(max_tokens=12 + len(tags.forced_end), thinking_token_budget=budget, logprobs=0, **GREEDY)
    outs = [o.outputs[0] for o in run_all(engine, prompts, limited)]
    for prompt, own, out in zip(prompts, free, outs):
        cut = budget + len(tags.forced_end)
        assert out.token_ids[:budget] == own[:budget]
        assert tuple(out.token_ids[budget:cut]) == tags.forced_end
        # after it, the model's answer as if prompt + reasoning + forced end were the prompt: the K/V are right
        after = run_all(engine, [prompt + out.token_ids[:cut]], SamplingParams(max_tokens=12 - budget, **GREEDY))
        assert out.token_ids[cut:] == after[0].outputs[0].token_ids
        scored = run_all(engine, [prompt + out.token_ids[:cut]], SamplingParams(max_tokens=1, prompt_logprobs=0,
                                                                                **GREEDY))[0]
        forced_logprobs = [lp.logprob for lp in out.logprobs[budget:cut]]
        teacher = [lp.logprob for lp in scored.prompt_logprobs[len(prompt) + budget:]]
        assert forced_logprobs == pytest.approx(teacher, abs=1e-4)  # the model's own, not 0


def test_each_of_n_samples_and_each_request_keeps_its_own_budget(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, reasoning_parser="deepseek_r1")
    tags = tags_of(engine)
    prompts = [p + list(tags.start) for p in random_prompts(2, seed=4)]
    params = [SamplingParams(n=3, seed=1, max_tokens=16, thinking_token_budget=2, ignore_eos=True),
              SamplingParams(n=1, max_tokens=16, thinking_token_budget=4, **GREEDY)]
    outs = run_all(engine, prompts, params)
    for request, budget in zip(outs, (2, 4)):
        for completion in request.outputs:
            ids = completion.token_ids
            assert tuple(ids[budget:budget + len(tags.forced_end)]) == tags.forced_end
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1  # three samples, not one


def test_a_budget_survives_preemption(tiny_llama_dir):
    roomy = make_engine(tiny_llama_dir, reasoning_parser="qwen3")
    tags = tags_of(roomy)
    prompts = [p + list(tags.start) for p in random_prompts(6, seed=9, low=20, high=30)]
    params = SamplingParams(max_tokens=30, thinking_token_budget=5, **GREEDY)
    want = [o.outputs[0].token_ids for o in run_all(roomy, prompts, params)]
    tight = make_engine(tiny_llama_dir, reasoning_parser="qwen3", num_blocks=40)
    got = [o.outputs[0].token_ids for o in run_all(tight, prompts, params, check_every_step=True)]
    assert tight.scheduler.num_preemptions > 0
    assert got == want


def test_a_budget_without_reasoning_tags_is_refused_and_leaves_nothing_behind(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(InvalidInputError, match="thinking_token_budget needs the reasoning tags"):
        engine.add_request(None, [5, 6, 7], SamplingParams(thinking_token_budget=3))
    assert not engine.has_unfinished_requests() and engine.kv.num_used_blocks == 0
