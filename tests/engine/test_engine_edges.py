"""Engine core edges a mutation run showed unguarded: the default context length, request ids, prompts and
their checks, the swap space's size, failures, the greedy path's rows, stats and the KV snapshot, the
concurrency figures, chunked prompt counts, and outputs that stay as they were handed out."""

import pytest
import torch
from test_engine import GREEDY, make_engine, run_all, tokens

from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams


def _finish(engine, max_steps=500):
    outs = []
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return outs
        outs += engine.step()
    pytest.fail("unfinished")


def test_default_max_model_len_is_capped_for_a_long_context_model(tmp_path):
    from tiny import save_tiny_dir

    path = save_tiny_dir(tmp_path / "long", max_position_embeddings=32768)
    engine = make_engine(path)
    assert engine.max_model_len == 8192
    assert make_engine(path, max_model_len=10000).max_model_len == 10000


def test_contiguous_allocator_shares_no_prefix_blocks(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, allocator="contiguous", max_model_len=64)
    prompt = list(range(10, 40))
    params = SamplingParams(max_tokens=3, **GREEDY)
    run_all(engine, [prompt], params)
    run_all(engine, [prompt], params)
    assert engine.stats().prefix_hits_tokens == 0


def test_swap_space_holds_its_size_in_tokens(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, swap_space="96KiB")
    mc = engine.model_config
    token_bytes = 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 4  # K and V, float32
    assert engine.scheduler.swap_tokens == 96 * 1024 // token_bytes


def test_a_request_id_in_use_is_refused(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=4, **GREEDY))
    with pytest.raises(InvalidInputError, match="already in use"):
        engine.add_request("a", [8, 9], SamplingParams(max_tokens=4, **GREEDY))
    outs = [o for o in _finish(engine) if o.finished]
    assert [o.request_id for o in outs] == ["a"] and outs[0].prompt_token_ids == [5, 6, 7]
    engine.add_request("a", [8, 9], SamplingParams(max_tokens=1, **GREEDY))  # free again once finished


def test_a_truncated_prompt_shows_no_text(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request("t", "hello world hello world", SamplingParams(max_tokens=1, truncate_prompt_tokens=2, **GREEDY))
    engine.add_request("f", "hello world", SamplingParams(max_tokens=1, **GREEDY))
    outs = {o.request_id: o for o in _finish(engine) if o.finished}
    assert len(outs["t"].prompt_token_ids) == 2 and outs["t"].prompt is None
    assert outs["f"].prompt == "hello world"


def test_truncation_side_right_keeps_the_prompts_first_tokens():
    ids = list(range(10, 20))
    assert SamplingParams(truncate_prompt_tokens=3).truncated_prompt(ids, 100) == ids[-3:]
    assert SamplingParams(truncate_prompt_tokens=3, truncation_side="right").truncated_prompt(ids, 100) == ids[:3]
    with pytest.raises(InvalidInputError, match="^truncation_side "):
        SamplingParams(truncation_side="middle")


def test_arrival_time_given_is_kept(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=1, **GREEDY), arrival_time=123.5)
    (out,) = [o for o in _finish(engine) if o.finished]
    assert out.metrics.arrival_time == 123.5


def test_an_engine_whose_executor_failed_refuses_to_step(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=3, **GREEDY))
    engine.executor.failure = RuntimeError("rank 1 died")
    with pytest.raises(RuntimeError, match="rank 1 died"):
        engine.step()
    assert engine.kv.num_used_blocks == 0  # nothing was scheduled


def test_a_failed_step_keeps_the_blocks_of_earlier_steps_cached(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    prompt, params = list(range(10, 30)), SamplingParams(max_tokens=2, **GREEDY)
    run_all(engine, [prompt], params)
    cached = engine.stats().blocks_cached_free
    assert cached > 0
    execute = engine.executor.execute
    engine.executor.execute = lambda *args: (_ for _ in ()).throw(RuntimeError("injected"))
    engine.add_request("x", list(range(100, 120)), params)
    with pytest.raises(RuntimeError, match="injected"):
        engine.step()
    engine.executor.execute = execute
    engine.abort_request("x")
    assert engine.stats().blocks_cached_free == cached


def test_a_step_with_prompt_logprob_rows_does_not_take_the_greedy_path(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    seen, execute = [], engine.executor.execute
    engine.executor.execute = lambda copies, seqs, greedy_rows: seen.append(list(greedy_rows)) or execute(
        copies, seqs, greedy_rows)
    engine.add_request("p", list(range(10, 20)), SamplingParams(max_tokens=2, prompt_logprobs=1, **GREEDY))
    (out,) = [o for o in _finish(engine) if o.finished]
    assert len(out.prompt_logprobs) == 10
    assert seen[0] == [True] + [False] * 9  # the sampled row, then the 9 prompt rows


def test_an_empty_text_prompt_is_refused(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    with pytest.raises(InvalidInputError, match="prompt is empty"):
        engine.add_request("e", "", SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("bad", [384, 6.0, True])
def test_prompt_token_ids_outside_the_vocabulary_or_not_ints_are_refused(tiny_llama_dir, bad):
    engine = make_engine(tiny_llama_dir)
    assert engine.model_config.vocab_size == 384
    with pytest.raises(InvalidInputError, match="must be integers in"):
        engine.add_request("b", [5, bad], SamplingParams(max_tokens=2))
    assert not engine.has_unfinished_requests()


def test_a_beam_width_above_max_num_seqs_is_refused_at_once(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_seqs=2)
    with pytest.raises(InvalidInputError, match="beam width 4 is above max_num_seqs"):
        engine.add_request("b", [5, 6, 7], SamplingParams(use_beam_search=True, beam_width=4, n=1, max_tokens=3,
                                                          temperature=0.0))
    assert not engine.has_unfinished_requests()


def test_allowed_tokens_that_are_exactly_the_stop_tokens_with_min_tokens_are_refused(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    eos = sorted(engine.eos_token_ids)
    with pytest.raises(InvalidInputError, match="allowed_token_ids are all stop tokens"):
        engine.add_request("s", [5, 6, 7], SamplingParams(max_tokens=3, min_tokens=2, allowed_token_ids=eos))
    assert not engine.has_unfinished_requests()


def test_warm_up_on_a_pool_smaller_than_the_dummy_prompt(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=4)  # 16 token slots < warm_up's 32 tokens
    engine.warm_up()
    params = SamplingParams(max_tokens=4, **GREEDY)
    assert tokens(run_all(engine, [[5, 6, 7]], params)) == tokens(run_all(make_engine(tiny_llama_dir), [[5, 6, 7]], params))


def test_stats_pool_figures(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_seqs=1)  # 256 blocks of 4 tokens
    params = SamplingParams(max_tokens=5, **GREEDY)
    engine.add_request("a", list(range(10, 20)), params)
    engine.add_request("b", list(range(30, 40)), params)
    engine.add_request("c", list(range(50, 60)), params)
    engine.step()  # a's prompt: 10 tokens in 3 blocks; b and c wait
    s = engine.stats()
    assert (s.tokens_stored, s.blocks_used, s.blocks_free) == (10, 3, 253)
    assert s.token_occupancy == 10 / 1024 and s.block_occupancy == 3 / 256
    assert (s.num_running, s.num_waiting) == (1, 2)
    _finish(engine)
    s = engine.stats()
    assert s.blocks_cached_free > 0 and s.blocks_free == 256 and s.blocks_used == 0


def test_eos_ids_join_model_and_tokenizer_and_drop_ids_outside_the_vocabulary(tmp_path):
    from tiny import save_tiny_dir

    engine = make_engine(save_tiny_dir(tmp_path / "m", eos_token_id=[4, 384]))  # tokenizer's eos: 2; vocab 384
    assert engine.eos_token_ids == {2, 4}


def test_model_name_of_a_file_is_its_stem(tmp_path):
    from pagedllm.engine.llm_engine import _model_name

    (tmp_path / "tinyllama-q8.gguf").write_bytes(b"GGUF")
    assert _model_name(str(tmp_path / "tinyllama-q8.gguf")) == "tinyllama-q8"
    (tmp_path / "Qwen2.5-0.5B").mkdir()
    assert _model_name(str(tmp_path / "Qwen2.5-0.5B")) == "Qwen2.5-0.5B"


def test_served_model_name_is_the_engines_model_name(tiny_llama_dir):
    assert make_engine(tiny_llama_dir, served_model_name="my-model").model_name == "my-model"
    assert make_engine(tiny_llama_dir).model_name == tiny_llama_dir.name


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    from pagedllm.model.loader import load_model

    return load_model(tiny_llama_dir)


def _runner(loaded, num_blocks=32):
    return ModelRunner(*loaded, num_blocks=num_blocks, block_size=4, dtype=torch.float32, attention_impl="reference")


def test_a_runner_of_zero_blocks_is_refused(loaded):
    with pytest.raises(InvalidInputError, match="must be positive"):
        _runner(loaded, num_blocks=0)


def test_prepare_counts_the_prompt_logits_rows(loaded):
    step = _runner(loaded).prepare([SeqInput([5, 6, 7], 0, [0], prompt_logits=range(0, 2)), SeqInput([8], 3, [1])])
    assert step.logits_rows.tolist() == [2, 3, 0, 1] and step.num_prompt_rows == 2


def test_kv_snapshot_owners_once_and_counts_add_up_with_cached_blocks(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=64)
    run_all(engine, [list(range(10, 30))], SamplingParams(max_tokens=2, **GREEDY))  # leaves cached blocks
    engine.add_request("a", list(range(40, 60)), SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=8))
    engine.step()
    engine.step()
    snap = engine.kv_snapshot()
    counts, blocks = snap["counts"], snap["blocks"]
    assert counts["cached"] > 0 and counts["used"] + counts["cached"] + counts["free"] == 64
    assert counts["free"] == sum(b["state"] == "free" for b in blocks)
    shared = [b for b in blocks if b["ref_cnt"] > 1]
    assert shared and all(b["owners"] == ["a"] for b in shared)


def test_kv_snapshot_empty_tail_fraction(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=64)
    engine.add_request("a", list(range(40, 58)), SamplingParams(max_tokens=8, **GREEDY))  # 18 tokens: 5 blocks
    engine.step()
    waste = engine.kv_snapshot()["waste"]
    assert (waste["used_slots"], waste["empty_tail_slots"]) == (20, 2)
    assert waste["empty_tail_fraction"] == 2 / 20


def test_idle_steps_leave_the_concurrency_mean_alone(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [[5, 6, 7], [8, 9, 10]], SamplingParams(max_tokens=4, **GREEDY))
    before = engine.stats()
    assert before.running_seqs_mean > 1
    for _ in range(5):
        assert engine.step() == []
    after = engine.stats()
    assert after.running_seqs_mean == before.running_seqs_mean and after.running_seqs_last == 0


def test_concurrency_mean_of_one_request_is_one(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    run_all(engine, [[5, 6, 7]], SamplingParams(max_tokens=4, **GREEDY))
    s = engine.stats()
    assert (s.running_seqs_mean, s.running_seqs_peak) == (1.0, 1)


def test_a_chunked_prompt_counts_its_tokens_once(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, max_num_batched_tokens=16)
    run_all(engine, [list(range(10, 50))], SamplingParams(max_tokens=2, **GREEDY))
    s = engine.stats()
    assert (s.prompt_tokens_total, s.generation_tokens_total) == (40, 2)


def test_an_output_handed_out_keeps_its_logprobs(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=4, logprobs=1, **GREEDY))
    outs = _finish(engine)
    assert len(outs) == 4
    for out in outs:
        c = out.outputs[0]
        assert len(c.logprobs) == len(c.token_ids)


def test_a_chat_prompt_is_encoded_without_special_tokens_of_the_tokenizers_own(tiny_llama_dir):
    """The template wrote the BOS where the model wants one; the tokenizer must not add another."""
    engine = make_engine(tiny_llama_dir)
    encode = engine.tokenizer.encode
    engine.tokenizer.encode = lambda text, add_special_tokens=True: [1] * add_special_tokens + encode(
        text, add_special_tokens=False)
    text, ids = engine.apply_chat_template([{"role": "user", "content": "hi"}])
    assert ids == encode(text, add_special_tokens=False)
