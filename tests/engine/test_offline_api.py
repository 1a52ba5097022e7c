"""The offline API in the shapes vLLM's users write: prompt dicts, per-token logprob dicts with ranks,
get_tokenizer, chat with a template of one's own, an empty batch."""

import subprocess
import sys

import pytest
import torch
from test_engine import GREEDY, hf_model, random_prompts  # noqa: F401  (hf_model: fixture)
from test_prompt_logprobs import check_rank

from pagedllm.engine.outputs import Logprob
from pagedllm.entrypoints.llm import LLM
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), num_blocks=128, block_size=4, dtype="float32")


def test_prompt_dicts_run_as_their_text_or_ids(llm):
    ids = random_prompts(1, seed=3, low=9, high=9)[0]
    params = SamplingParams(max_tokens=4, **GREEDY)
    plain = llm.generate(["hello there", ids], params, use_tqdm=False)
    dicts = llm.generate([{"prompt": "hello there"}, {"prompt_token_ids": ids, "prompt": "shown"}], params,
                         use_tqdm=False)  # fmt: skip
    assert [o.outputs[0].token_ids for o in dicts] == [o.outputs[0].token_ids for o in plain]
    assert [o.prompt for o in dicts] == ["hello there", "shown"]
    (single,) = llm.generate({"prompt_token_ids": ids}, params, use_tqdm=False)
    assert single.prompt_token_ids == ids and single.prompt is None


def test_a_prompt_dicts_cache_salt_keeps_its_prefix_apart(llm):
    ids = random_prompts(1, seed=4, low=17, high=17)[0]
    params = SamplingParams(max_tokens=1, **GREEDY)
    llm.generate({"prompt_token_ids": ids, "cache_salt": "a"}, params, use_tqdm=False)
    (same,) = llm.generate({"prompt_token_ids": ids, "cache_salt": "a"}, params, use_tqdm=False)
    (other,) = llm.generate({"prompt_token_ids": ids, "cache_salt": "b"}, params, use_tqdm=False)
    assert (same.num_cached_tokens, other.num_cached_tokens) == (16, 0)


@pytest.mark.parametrize("prompt,message", [
    ({}, "needs prompt or prompt_token_ids"), ({"prompt": 5}, "must be a string"),
    ({"prompt_token_ids": "abc"}, "list of ints"), ({"prompt": "hi", "multi_modal_data": {}}, "not supported"),
    ({"prompt": "hi", "cache_salt": 3}, "cache_salt must be a string"),
])  # fmt: skip
def test_bad_prompt_dicts_are_refused(llm, prompt, message):
    with pytest.raises(InvalidInputError, match=message):
        llm.generate([prompt], use_tqdm=False)
    assert llm.engine.requests == {} and llm.engine.kv.num_used_blocks == 0


def test_an_empty_batch_gives_no_outputs(llm):
    assert llm.generate([], use_tqdm=False) == [] and llm.chat([], use_tqdm=False) == []


def test_get_tokenizer_is_the_models_tokenizer(llm):
    assert llm.get_tokenizer() is llm.tokenizer is llm.engine.tokenizer


def test_chat_with_a_template_of_ones_own(llm):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    (out,) = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=2, **GREEDY), use_tqdm=False,
                      chat_template=template)  # fmt: skip
    assert out.prompt == "[user] hi\n"
    assert out.prompt_token_ids == llm.tokenizer.encode(out.prompt, add_special_tokens=False)
    with pytest.raises(InvalidInputError, match="chat_template must be a template's text"):
        llm.chat([{"role": "user", "content": "hi"}], chat_template=3)


def test_chat_gives_the_template_the_tools(llm):
    template = ("{% for t in tools %}<{{ t.function.name }}>{% endfor %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    (out,) = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1, **GREEDY), use_tqdm=False,
                      chat_template=template, tools=tools)  # fmt: skip
    assert out.prompt == "<get_weather>hi"
    with pytest.raises(InvalidInputError, match="only function tools"):
        llm.chat([{"role": "user", "content": "hi"}], chat_template=template, tools=[{"type": "retrieval"}])


def test_sampled_tokens_logprobs_read_as_vllms_dicts_with_ranks(llm, hf_model):
    """Sampled (not the likeliest) tokens: their ranks against transformers' logprobs of the same positions."""
    prompt = random_prompts(1, seed=5, low=12, high=12)[0]
    params = SamplingParams(max_tokens=8, temperature=1.5, seed=3, logprobs=2, ignore_eos=True)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    completion = out.outputs[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + completion.token_ids])).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits.float(), dim=-1)
    for position, entry in enumerate(completion.logprobs):
        check_rank(want[position], entry)
        text = entry[entry.token_id].decoded_token
        assert entry[entry.token_id] == Logprob(entry.logprob, entry.rank, text)
        alone = llm.tokenizer.decode([entry.token_id])
        assert text == alone or alone.endswith("\ufffd")  # "" or a whole character where one spans tokens
        assert entry == dict(entry) and dict(entry) == entry  # compares as the dict it reads as
    assert "".join(entry[entry.token_id].decoded_token for entry in completion.logprobs) == completion.text
    assert any(entry.rank > 2 for entry in completion.logprobs)  # some fall outside the top 2
    assert completion.finished() and out.num_cached_tokens == out.metrics.num_cached_prompt_tokens


def test_a_script_sees_the_engines_startup_lines_and_can_stop_it(tiny_llama_dir):
    """As vLLM's LLM shows its own: without any logging set up, the startup lines reach stderr."""
    script = f"from pagedllm import LLM\nllm = LLM(model={str(tiny_llama_dir)!r}, num_blocks=64, block_size=4)\n" \
             "llm.shutdown()\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "INFO pagedllm: KV pool: 64 blocks x 4 tokens" in run.stderr


def test_allowed_token_ids_pick_the_likeliest_allowed_token(llm, hf_model):
    prompt = random_prompts(1, seed=6, low=10, high=10)[0]
    allowed = [11, 57, 123, 200]
    params = SamplingParams(max_tokens=6, allowed_token_ids=allowed, logprobs=0, **GREEDY)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    ids = out.outputs[0].token_ids
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    assert ids == [allowed[int(row[allowed].argmax())] for row in logits]
    want = torch.log_softmax(logits.float(), dim=-1)  # the model's own logprobs, as with logit_bias
    assert [e.logprob for e in out.outputs[0].logprobs] == pytest.approx([float(want[i, t]) for i, t in enumerate(ids)],
                                                                         abs=1e-4)
    with pytest.raises(InvalidInputError, match="allowed_token_ids must name tokens below the vocabulary size"):
        llm.generate([prompt], SamplingParams(allowed_token_ids=[10**6]), use_tqdm=False)
    stop_only = SamplingParams(allowed_token_ids=[7], stop_token_ids=[7], min_tokens=2)  # nothing to sample at first
    with pytest.raises(InvalidInputError, match="allowed_token_ids are all stop tokens"):
        llm.generate([prompt], stop_only, use_tqdm=False)


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(llm):
    ids = random_prompts(1, seed=7, low=30, high=30)[0]
    plain = SamplingParams(max_tokens=3, **GREEDY)
    cut = SamplingParams(max_tokens=3, truncate_prompt_tokens=5, **GREEDY)
    (short,), (truncated,) = llm.generate([ids[-5:]], plain, use_tqdm=False), llm.generate([ids], cut, use_tqdm=False)
    assert truncated.prompt_token_ids == ids[-5:] and truncated.outputs[0].token_ids == short.outputs[0].token_ids
    (text,) = llm.generate("a prompt of several words", cut, use_tqdm=False)
    assert text.prompt is None and len(text.prompt_token_ids) == 5  # the text no longer matches the ids
    (whole,) = llm.generate("hi", cut, use_tqdm=False)
    assert whole.prompt == "hi"  # nothing cut
    past = SamplingParams(truncate_prompt_tokens=llm.engine.max_model_len + 1)
    with pytest.raises(InvalidInputError, match="truncate_prompt_tokens must be -1 or in"):
        llm.generate([ids], past, use_tqdm=False)
    assert llm.engine.requests == {}


def test_detokenize_false_gives_the_same_tokens_and_no_text(llm):
    ids = random_prompts(1, seed=8, low=8, high=8)[0]
    kinds = [dict(**GREEDY, logprobs=2, prompt_logprobs=1), dict(n=2, temperature=1.0, seed=4, ignore_eos=True),
             dict(use_beam_search=True, n=2, temperature=0.0)]
    for kind in kinds:
        (text,) = llm.generate([ids], SamplingParams(max_tokens=5, **kind), use_tqdm=False)
        (bare,) = llm.generate([ids], SamplingParams(max_tokens=5, detokenize=False, **kind), use_tqdm=False)
        assert [c.token_ids for c in bare.outputs] == [c.token_ids for c in text.outputs]
        assert all(c.text == "" for c in bare.outputs) and any(c.text for c in text.outputs)
    assert bare.outputs[0].finished()
    (bare,) = llm.generate([ids], SamplingParams(max_tokens=2, detokenize=False, **kinds[0]), use_tqdm=False)
    entry = bare.outputs[0].logprobs[0]
    assert entry[entry.token_id].decoded_token is None and bare.prompt_logprobs[1][ids[1]].decoded_token is None
    with pytest.raises(InvalidInputError, match="needs detokenize=True"):
        SamplingParams(stop=["x"], detokenize=False)


def test_outputs_pickle_with_their_tokens_texts_not_the_tokenizer(llm):
    import copy
    import pickle

    (out,) = llm.generate(["hello"], SamplingParams(max_tokens=3, logprobs=2, **GREEDY), use_tqdm=False)
    data = pickle.dumps(out)
    assert len(data) < 20_000  # the tokenizer alone pickles to far more
    for again in (pickle.loads(data), copy.deepcopy(out)):
        entries, originals = again.outputs[0].logprobs, out.outputs[0].logprobs
        assert [dict(e) for e in entries] == [dict(e) for e in originals]  # decoded_token included


def test_use_tqdm_takes_a_progress_bar_class_as_vllms_does(llm):
    from tqdm import tqdm

    made = []

    def bar(*args, **kwargs):
        made.append(kwargs)
        return tqdm(*args, **kwargs, leave=False)

    outs = llm.generate(["a", "b"], SamplingParams(max_tokens=2, **GREEDY), use_tqdm=bar)
    assert len(outs) == 2 and made[0]["total"] == 2 and not made[0]["disable"]


def test_a_batch_whose_later_prompt_is_refused_queues_nothing(llm):
    with pytest.raises(InvalidInputError):
        llm.generate([[5, 6, 7], [10**6]], SamplingParams(max_tokens=2, **GREEDY), use_tqdm=False)
    assert llm.engine.requests == {} and not llm.engine.has_unfinished_requests()


def test_a_failed_step_frees_the_batch(llm, monkeypatch):
    step, calls = llm.engine.step, []

    def failing():
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom")
        return step()

    monkeypatch.setattr(llm.engine, "step", failing)
    with pytest.raises(RuntimeError, match="boom"):
        llm.generate([[5, 6, 7], [8, 9, 10]], SamplingParams(max_tokens=5, **GREEDY), use_tqdm=False)
    monkeypatch.undo()
    assert llm.engine.requests == {} and llm.engine.kv.num_used_blocks == 0


def test_outputs_come_in_prompt_order_not_finish_order(llm):
    params = [SamplingParams(max_tokens=6, **GREEDY), SamplingParams(max_tokens=1, **GREEDY)]
    outs = llm.generate([[5, 6, 7], [8, 9, 10]], params, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [[5, 6, 7], [8, 9, 10]]
    assert [len(o.outputs[0].token_ids) for o in outs] == [6, 1]


def test_a_params_list_of_the_wrong_length_is_refused(llm):
    with pytest.raises(InvalidInputError, match="SamplingParams for 2 prompts"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=1)], use_tqdm=False)
    assert llm.engine.requests == {}


def test_an_unknown_engine_option_is_refused_by_name(tiny_llama_dir):
    with pytest.raises(InvalidInputError, match="unknown engine option.*no_such_option"):
        LLM(model=str(tiny_llama_dir), no_such_option=1)


def test_reset_prefix_cache_forgets_the_cached_prefixes(tiny_llama_dir):
    """As vLLM's LLM.reset_prefix_cache(): after it a prompt seen before finds no cached prefix; it is refused
    (False) while a running request holds hashed blocks."""
    llm = LLM(model=str(tiny_llama_dir), num_blocks=64, block_size=4, dtype="float32")
    prompt, params = list(range(5, 30)), SamplingParams(max_tokens=2, temperature=0.0)
    llm.generate([prompt], params)
    hits = llm.stats().prefix_hits_tokens
    llm.generate([prompt], params)
    assert llm.stats().prefix_hits_tokens - hits == 24  # six whole blocks, all but the last token
    engine = llm.engine
    engine.add_request("running", prompt, SamplingParams(max_tokens=8, temperature=0.0))
    engine.step()
    assert llm.reset_prefix_cache() is False
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.reset_prefix_cache() is True
    hits = llm.stats().prefix_hits_tokens
    llm.generate([prompt], params)
    assert llm.stats().prefix_hits_tokens == hits
    assert llm.stats().blocks_used == 0


def test_logprob_token_ids_give_those_tokens_logprobs_at_every_position(llm, hf_model):
    """vLLM's logprob_token_ids: each named token's logprob (transformers' for the same positions), in the order
    named, each once, in a batch beside a top-k request and one without logprobs, which stay as they are alone."""
    prompts = random_prompts(3, seed=7, low=10, high=14)
    named = [300, 5, 77, 5, 1]
    sampled = {"max_tokens": 6, "temperature": 1.2, "seed": 4, "ignore_eos": True}
    asked = [SamplingParams(logprob_token_ids=named, **sampled), SamplingParams(logprobs=3, **sampled),
             SamplingParams(**sampled)]
    together = llm.generate(prompts, asked, use_tqdm=False)
    alone = [llm.generate([p], params, use_tqdm=False)[0] for p, params in zip(prompts, asked)]
    completion = together[0].outputs[0]
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompts[0] + completion.token_ids])).logits[0, len(prompts[0]) - 1 : -1]
    want = torch.log_softmax(logits.float(), dim=-1)
    for position, entry in enumerate(completion.logprobs):
        assert list(entry.top) == [300, 5, 77, 1]
        assert list(entry.top.values()) == pytest.approx(want[position, [300, 5, 77, 1]].tolist(), abs=1e-4)
        check_rank(want[position], entry)
    for both, one in zip(together, alone):
        assert both.outputs[0].token_ids == one.outputs[0].token_ids
        for a, b in zip(both.outputs[0].logprobs or [], one.outputs[0].logprobs or [], strict=True):
            assert list(a.top) == list(b.top) and list(a.top.values()) == pytest.approx(list(b.top.values()))
    assert together[2].outputs[0].logprobs is None and len(together[1].outputs[0].logprobs[0].top) == 3


@pytest.mark.parametrize("fields,name", [
    ({"logprob_token_ids": list(range(129))}, "logprob_token_ids"), ({"logprob_token_ids": [-1]}, "logprob_token_ids"),
    ({"logprob_token_ids": [1, 2], "logprobs": 3}, "logprobs"),
    ({"logprob_token_ids": [1], "use_beam_search": True, "temperature": 0.0}, "logprob_token_ids")])
def test_bad_logprob_token_ids_are_refused_by_name(fields, name):
    with pytest.raises(InvalidInputError, match=f"^{name} "):
        SamplingParams(**fields)


def test_logprob_token_ids_past_the_vocabulary_are_refused(llm):
    with pytest.raises(InvalidInputError, match="logprob_token_ids must name tokens below the vocabulary"):
        llm.generate(["hi"], SamplingParams(logprob_token_ids=[10**6]), use_tqdm=False)
