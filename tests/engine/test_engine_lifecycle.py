"""Requests' lives through the whole engine on a tiny random model: admission limits, beams under a small
budget, the offline API's order and all-or-nothing batches, aborts in swap space, per-step deltas."""

import pytest
from test_engine import GREEDY, make_engine, random_prompts, run_all, tokens

from pagedllm.engine import output_stage
from pagedllm.entrypoints.llm import LLM
from pagedllm.errors import InvalidInputError, ModelLoadError
from pagedllm.sampling_params import SamplingParams


def step_until_done(engine, max_steps: int = 500) -> list:
    outputs = []
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outputs
        outputs += engine.step()
    pytest.fail(f"requests still unfinished after {max_steps} steps (starved?)")


def test_beam_search_with_a_prompt_over_twice_the_step_budget_finishes(tiny_llama_dir):
    prompt = random_prompts(1, seed=20, low=40, high=40)[0]
    params = SamplingParams(use_beam_search=True, beam_width=3, n=2, max_tokens=6, temperature=0.0, ignore_eos=True)
    roomy = run_all(make_engine(tiny_llama_dir, max_num_batched_tokens=256), [prompt], params)[0]
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=16)
    engine.add_request("beam", prompt, params)
    engine.add_request("other", random_prompts(1, seed=21)[0], SamplingParams(max_tokens=30, **GREEDY))
    done = {o.request_id: o for o in step_until_done(engine) if o.finished}
    assert [c.token_ids for c in done["beam"].outputs] == [c.token_ids for c in roomy.outputs]
    assert engine.kv.num_used_blocks == 0


@pytest.mark.parametrize("limit", [1, 3])
def test_max_num_seqs_is_exact(tiny_llama_dir, limit):
    engine = make_engine(tiny_llama_dir, max_num_seqs=limit)
    for i, prompt in enumerate(random_prompts(6, seed=22)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=4, **GREEDY))
    finish_order, running = [], []
    while engine.has_unfinished_requests():
        finish_order += [o.request_id for o in engine.step() if o.finished]
        running.append(engine.stats().running_seqs_last)
    assert max(running) == limit and engine.stats().running_seqs_peak == limit
    if limit == 1:
        assert finish_order == [f"r{i}" for i in range(6)]  # one at a time, in arrival order


def test_a_prompt_of_exactly_max_model_len_tokens_is_rejected(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_model_len=32)
    with pytest.raises(InvalidInputError, match="maximum context length is 32"):
        engine.add_request("full", list(range(5, 37)), SamplingParams(max_tokens=1))
    assert not engine.has_unfinished_requests()
    engine.add_request("fits", list(range(5, 36)), SamplingParams(max_tokens=5, **GREEDY))
    (out,) = [o for o in step_until_done(engine) if o.finished]
    assert len(out.outputs[0].token_ids) == 1 and out.outputs[0].finish_reason == "length"


def test_a_max_model_len_past_the_models_own_is_refused(tiny_llama_dir):
    with pytest.raises(InvalidInputError, match="max_model_len 1024 exceeds the model's maximum context length 512"):
        make_engine(tiny_llama_dir, max_model_len=1024)
    assert make_engine(tiny_llama_dir, max_model_len=512).max_model_len == 512


def test_a_sliding_window_model_runs_within_its_window(tmp_path):
    from tiny import save_tiny_dir

    path = save_tiny_dir(tmp_path / "mistral", "mistral", sliding_window=48)
    assert make_engine(path).max_model_len == 48  # within the window whole-context attention is the same
    with pytest.raises(InvalidInputError, match="max_model_len 64 exceeds the model's sliding attention window"):
        make_engine(path, max_model_len=64)


def test_generation_config_end_tokens_stop_generation(tmp_path, tiny_llama_dir):
    import json
    import shutil

    free = run_all(make_engine(tiny_llama_dir), [[5, 6, 7]], SamplingParams(max_tokens=8, temperature=0.0))[0]
    stop_at = free.outputs[0].token_ids[3]
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    # 9999 lies outside the vocabulary: it could never end a sequence, and masking it for min_tokens would fail
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [2, stop_at,
                                                                                                      9999]}))
    out = run_all(make_engine(tmp_path / "m"), [[5, 6, 7]], SamplingParams(max_tokens=8, temperature=0.0,
                                                                           min_tokens=1))[0]
    first = free.outputs[0].token_ids.index(stop_at)
    assert out.outputs[0].token_ids == free.outputs[0].token_ids[: first + 1]
    # as in vLLM: the model's end tokens other than the tokenizer's are stop tokens, reported as the reason
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", stop_at)
    eos = run_all(make_engine(tmp_path / "m"), [[5, 6, 7]], SamplingParams(max_tokens=8, logit_bias={2: 100},
                                                                           stop_token_ids=[2]))[0]
    assert (eos.outputs[0].token_ids, eos.outputs[0].finish_reason, eos.outputs[0].stop_reason) == ([2], "stop", None)


@pytest.mark.parametrize("min_tokens", [0, 2])
def test_a_stop_token_id_outside_the_vocabulary_is_refused(tiny_llama_dir, min_tokens):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(InvalidInputError, match=r"stop_token_ids must name tokens below the vocabulary size 384; "
                                                r"got \[384\]"):
        engine.add_request("r", [5, 6, 7], SamplingParams(stop_token_ids=[384], min_tokens=min_tokens, max_tokens=4))
    assert not engine.has_unfinished_requests() and engine.kv.num_used_blocks == 0


def test_generate_returns_outputs_in_prompt_order(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), num_blocks=256, block_size=4)
    prompts = random_prompts(5, seed=23)
    lengths = [20, 2, 9, 1, 5]  # later prompts finish first
    outs = llm.generate(prompts, [SamplingParams(max_tokens=n, **GREEDY) for n in lengths], use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == prompts
    assert [len(o.outputs[0].token_ids) for o in outs] == lengths


def test_generate_with_a_bad_prompt_raises_and_leaves_no_request_behind(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), num_blocks=256, block_size=4)
    good = random_prompts(1, seed=24)[0]
    with pytest.raises(InvalidInputError, match="token ids"):
        llm.generate([good, [10**6]], SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests() and llm.engine.requests == {}
    assert llm.engine.kv.num_used_blocks == 0
    (out,) = llm.generate([good], SamplingParams(max_tokens=3, **GREEDY), use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 3


@pytest.mark.parametrize("prompts", [None, 5, b"hello", {"text": "hi"}, [1.0, 2.0], [1, 2.5], [None], [True, 2],
                                     "abc\ud800def"],
                         ids=["none", "int", "bytes", "dict", "floats", "mixed", "list-of-none", "bools", "surrogate"])
def test_generate_names_a_prompt_of_no_accepted_form(tiny_llama_dir, prompts):
    llm = LLM(model=str(tiny_llama_dir), num_blocks=64, block_size=4)
    with pytest.raises(InvalidInputError, match="prompt"):
        llm.generate(prompts, use_tqdm=False)
    with pytest.raises(InvalidInputError, match="sampling_params"):
        llm.generate("hi", {"temperature": 0}, use_tqdm=False)
    assert llm.engine.requests == {} and llm.engine.kv.num_used_blocks == 0


def test_beam_outputs_end_as_sampled_ones_do_on_a_stop_token(tiny_llama_dir):
    """A beam that ends on a stop token id: the token in its ids, its text only with include_stop_str_in_output,
    and it as the stop_reason (as for a sampled sequence)."""
    llm = LLM(model=str(tiny_llama_dir), num_blocks=256, block_size=4)
    prompt = random_prompts(1, seed=25)[0]
    beam = dict(use_beam_search=True, n=2, beam_width=2, max_tokens=6, temperature=0.0, ignore_eos=True)
    free = llm.generate([prompt], SamplingParams(**beam), use_tqdm=False)[0].outputs[0]
    stop = free.token_ids[-1]  # the best beam's last token, made a stop token
    for shown in (False, True):
        params = SamplingParams(**beam, stop_token_ids=[stop], include_stop_str_in_output=shown)
        ended = [c for c in llm.generate([prompt], params, use_tqdm=False)[0].outputs if c.finish_reason == "stop"]
        assert ended, "a beam was to end on the stop token"
        for c in ended:
            assert c.token_ids[-1] == stop and c.stop_reason == stop
            text = llm.engine.tokenizer.decode(c.token_ids if shown else c.token_ids[:-1], skip_special_tokens=True)
            assert c.text == text


def test_aborting_a_swapped_out_request_empties_its_swap_space(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=24, preemption_mode="swap")
    for i, prompt in enumerate(random_prompts(6, seed=25, low=20, high=30)):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=40, **GREEDY))
    swapped = []
    while not swapped:
        assert engine.has_unfinished_requests(), "the pool was meant to run out"
        engine.step()
        swapped = [r for r in engine.requests.values() if any(s.seq_id in engine.swap_space for s in r.seqs)]
    victim = swapped[-1]
    held = len(engine.swap_space)
    engine.abort_request(victim.request_id)
    assert len(engine.swap_space) == held - len(victim.seqs)
    assert all(s.seq_id not in engine.swap_space for s in victim.seqs)
    step_until_done(engine)
    assert len(engine.swap_space) == 0 and engine.kv.num_used_blocks == 0


def test_each_parallel_sample_equals_its_seeded_stream_run_alone(tiny_llama_dir, monkeypatch):
    """Completion i of a seeded n > 1 request draws from stream (seed, i). Run alone as n = 1, the same
    stream must give the same tokens: the shared prompt blocks (and their copy-on-write copies) are right."""
    prompt = random_prompts(1, seed=26, low=41, high=41)[0]  # 41 tokens: a partly filled, shared tail block
    params = dict(max_tokens=12, temperature=1.0, ignore_eos=True)
    (out,) = run_all(make_engine(tiny_llama_dir), [prompt], SamplingParams(n=4, seed=11, **params))
    real = output_stage.make_generator
    alias = 1000  # seed 1000 + i, run alone, draws from stream (11, i)
    monkeypatch.setattr(output_stage, "make_generator", lambda seed, index=0, device="cpu":
                        real(11, seed - alias, device) if seed >= alias else real(seed, index, device))
    alone = [tokens(run_all(make_engine(tiny_llama_dir), [prompt], SamplingParams(seed=alias + i, **params)))[0]
             for i in range(4)]
    assert [c.token_ids for c in out.outputs] == alone
    assert len({tuple(t) for t in alone}) == 4


def test_outputs_carry_each_steps_additions_once(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    params = SamplingParams(n=2, max_tokens=10, temperature=1.0, seed=3, logprobs=2, stop=["a"], ignore_eos=True)
    engine.add_request("d", random_prompts(1, seed=27)[0], params)
    text, ids, logprobs = ["", ""], [[], []], [[], []]
    outputs = step_until_done(engine)
    for output in outputs:
        for c in output.outputs:
            text[c.index] += c.new_text
            ids[c.index] += c.new_token_ids
            logprobs[c.index] += c.new_logprobs
    final = outputs[-1]
    # one output per step: the prefill samples the first token, each later step one more
    assert final.finished and len(outputs) == max(len(c.token_ids) for c in final.outputs)
    assert text == [c.text for c in final.outputs] and ids == [c.token_ids for c in final.outputs]
    assert logprobs == [c.logprobs for c in final.outputs]


@pytest.mark.parametrize("width,n,max_tokens", [(1, 1, 4), (3, 2, 6), (4, 4, 1)])
def test_beam_search_counts_every_beams_tokens_as_generated(tiny_llama_dir, width, n, max_tokens):
    engine = make_engine(tiny_llama_dir)
    params = SamplingParams(use_beam_search=True, beam_width=width, n=n, max_tokens=max_tokens, **GREEDY)
    run_all(engine, [[5, 6, 7, 8]], params)
    # every step extends `width` beams (one from the prompt in the first), each by one token, to max_tokens
    assert engine.stats().generation_tokens_total == width * max_tokens


def test_a_step_that_fails_leaves_no_unwritten_block_findable(tiny_llama_dir):
    """Two requests with one prompt admitted in one pass: the second hits the blocks just allocated for the first
    (written by the step). When that step fails and both are aborted, none of those blocks may stay cached."""
    engine = make_engine(tiny_llama_dir)
    prompt, params = list(range(10, 30)), SamplingParams(max_tokens=12, **GREEDY)
    expected = tokens(run_all(make_engine(tiny_llama_dir), [prompt], params))
    execute = engine.executor.execute
    engine.executor.execute = lambda *args: (_ for _ in ()).throw(RuntimeError("injected"))
    engine.add_request("a", prompt, params)
    engine.add_request("b", prompt, params)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    engine.executor.execute = execute
    engine.abort_request("a")
    engine.abort_request("b")
    assert engine.stats().blocks_cached_free == 0
    engine.kv.check_invariants()
    assert tokens(run_all(engine, [prompt], params)) == expected


def test_a_dropped_engine_leaves_nothing_frozen(tiny_llama_dir):
    """The engine freezes the heap it built (out of the collector's scans); were it left frozen, the pool's
    blocks, linked in cycles by the free queue, could never be collected after the engine goes."""
    import gc
    import weakref

    engine = make_engine(tiny_llama_dir)
    run_all(engine, [[5, 6, 7]], SamplingParams(max_tokens=2))
    assert gc.get_freeze_count() > 0
    gone = weakref.ref(engine)
    del engine
    gc.collect()
    assert gone() is None and gc.get_freeze_count() == 0


def test_a_kv_snapshot_window_and_the_whole_pools_figures_agree(tiny_llama_dir):
    """The counts and per-request blocks (from the block tables) equal what the blocks themselves say, and a
    window holds exactly those blocks of the whole list."""
    engine = make_engine(tiny_llama_dir, num_blocks=64)
    shared = random_prompts(1, seed=30, low=24, high=24)[0]
    engine.add_request("a", shared + [5], SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=20))
    engine.add_request("b", shared + [6], SamplingParams(max_tokens=20, **GREEDY))
    for _ in range(4):
        engine.step()
    whole = engine.kv_snapshot()
    blocks = whole["blocks"]
    assert len(blocks) == 64 and whole["offset"] == 0
    assert whole["counts"] == {"used": sum(b["state"] == "used" for b in blocks),
                               "shared": sum(b["ref_cnt"] > 1 for b in blocks),
                               "cached": sum(b["state"] == "cached" for b in blocks),
                               "free": sum(b["state"] == "free" for b in blocks)}
    assert whole["counts"]["shared"] > 0
    assert whole["requests"] == {r: sum(r in b["owners"] for b in blocks) for r in ("a", "b")}
    window = engine.kv_snapshot(offset=10, limit=5)
    assert window["blocks"] == blocks[10:15] and window["offset"] == 10
    assert {k: v for k, v in window.items() if k not in ("blocks", "offset")} == {
        k: v for k, v in whole.items() if k not in ("blocks", "offset")}


def test_generation_config_sampling_settings_are_the_defaults(tmp_path, tiny_llama_dir):
    """As in vLLM: where a request leaves a sampling field out, the model's generation_config.json value holds
    (top_k=1: greedy; max_new_tokens: max_tokens); the request's own value wins."""
    import json
    import shutil

    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    settings = {"temperature": 0.7, "top_k": 1, "max_new_tokens": 3, "do_sample": True}
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps(generation | settings))
    engine = make_engine(tmp_path / "m")
    assert engine.sampling_defaults == {"temperature": 0.7, "top_k": 1, "max_tokens": 3}
    prompt = [5, 6, 7, 8]
    greedy = run_all(make_engine(tiny_llama_dir), [prompt], SamplingParams(max_tokens=3, **GREEDY))[0]
    llm = LLM(model=str(tmp_path / "m"), num_blocks=64, block_size=4)
    (defaulted,) = llm.generate([prompt], use_tqdm=False)
    assert defaulted.outputs[0].token_ids == greedy.outputs[0].token_ids
    (own,) = llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0.0), use_tqdm=False)
    assert len(own.outputs[0].token_ids) == 5


def test_bad_generation_config_sampling_settings_are_refused_at_load(tmp_path, tiny_llama_dir):
    import json
    import shutil

    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({"top_p": 1.5}))
    with pytest.raises(ModelLoadError, match=r"generation_config.json's sampling settings: top_p must be in"):
        make_engine(tmp_path / "m")


def test_llm_chat_renders_as_the_server_does_and_checks_its_options(tiny_llama_dir):
    llm = LLM(model=str(tiny_llama_dir), num_blocks=64, block_size=4)
    messages = [{"role": "user", "content": "hello"}]
    (out,) = llm.chat(messages, SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
    assert (out.prompt, out.prompt_token_ids) == llm.engine.apply_chat_template(messages)  # the rendered text too
    for options, field in [({"add_generation_prompt": "no"}, "add_generation_prompt"),
                           ({"continue_final_message": None}, "continue_final_message"),
                           ({"chat_template_kwargs": "x"}, "chat_template_kwargs")]:
        with pytest.raises(InvalidInputError, match=field):
            llm.chat(messages, **options)


def test_a_beam_ending_on_one_of_the_models_other_end_tokens_reports_it(tmp_path, tiny_llama_dir):
    import json
    import shutil

    beam = SamplingParams(n=2, use_beam_search=True, beam_width=2, temperature=0.0, max_tokens=8)
    free = run_all(make_engine(tiny_llama_dir), [[5, 6, 7]], beam)[0]
    stop_at = free.outputs[0].token_ids[1]  # a hypothesis ending there still ranks among the best 2
    shutil.copytree(tiny_llama_dir, tmp_path / "m")
    generation = json.loads((tmp_path / "m" / "generation_config.json").read_text())
    (tmp_path / "m" / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [2, stop_at]}))
    out = run_all(make_engine(tmp_path / "m"), [[5, 6, 7]], beam)[0]
    ended = [c for c in out.outputs if c.finish_reason == "stop"]
    assert ended and all(c.token_ids[-1] == stop_at and c.stop_reason == stop_at for c in ended)
