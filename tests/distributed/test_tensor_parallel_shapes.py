"""Tensor parallelism on the CPU (gloo): swap, other shapes (size 3, a replicated KV head), bad splits.
Each test starts and stops its own engine (one tensor-parallel engine per process at a time)."""

import os

import pytest
import torch
from tp_helpers import children, completions, make_llm, same_completions

from pagedllm import SamplingParams
from pagedllm.engine.model_runner import SeqInput
from pagedllm.errors import InvalidInputError

PROMPTS = ["Hello world", "PagedAttention stores the KV cache in blocks", "The quick brown fox", "0123"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def test_swap_preemption_under_size_2_equals_size_1(tiny_llama_dir) -> None:
    options = dict(num_blocks=24, preemption_mode="swap", max_num_seqs=8)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    prompts = [f"{p} {i}" for i in range(3) for p in PROMPTS]
    expected = completions(make_llm(tiny_llama_dir, 1, **options), prompts, params)
    llm = make_llm(tiny_llama_dir, 2, **options)
    try:
        assert same_completions(completions(llm, prompts, params), expected)
        assert llm.stats().num_preemptions > 0
    finally:
        llm.engine.shutdown()


def test_size_3_logits_and_greedy_tokens_equal_size_1(tiny_tp3_dir) -> None:
    single = make_llm(tiny_tp3_dir, 1)
    expected = completions(single, PROMPTS, GREEDY)
    llm = make_llm(tiny_tp3_dir, 3)
    try:
        assert same_completions(completions(llm, PROMPTS, GREEDY), expected)
        step = [SeqInput([5, 17, 99, 3, 250, 8], 0, [40, 41]), SeqInput([7, 7, 300], 0, [42])]
        full = [e.engine.executor.execute([], step, [False, False]).full for e in (single, llm)]
        torch.testing.assert_close(full[1], full[0], atol=1e-4, rtol=0)
    finally:
        llm.engine.shutdown()


def test_a_kv_head_replicated_over_2_ranks(tiny_mqa_dir) -> None:
    expected = completions(make_llm(tiny_mqa_dir, 1), PROMPTS, GREEDY)
    llm = make_llm(tiny_mqa_dir, 2)
    try:
        assert llm.engine.runner.config.num_kv_heads == 1 and llm.engine.runner.config.num_heads == 2
        assert same_completions(completions(llm, PROMPTS, GREEDY), expected)
    finally:
        llm.engine.shutdown()


def test_a_split_that_does_not_divide_says_so_before_starting_anything(tiny_tp3_dir) -> None:
    before = children(os.getpid())
    with pytest.raises(InvalidInputError, match="cannot split 3 KV heads over 2 ranks"):
        make_llm(tiny_tp3_dir, 2)
    assert children(os.getpid()) == before


@pytest.mark.parametrize("timeout", ["soon", "nan", "inf", "1e-9", "-1"])
def test_a_bad_timeout_says_so_before_starting_anything(tiny_llama_dir, monkeypatch, timeout) -> None:
    monkeypatch.setenv("PAGEDLLM_TP_TIMEOUT", timeout)
    before = children(os.getpid())
    with pytest.raises(InvalidInputError, match="PAGEDLLM_TP_TIMEOUT must be a positive number"):
        make_llm(tiny_llama_dir, 2)
    assert children(os.getpid()) == before


def test_a_rank_that_cannot_load_its_shard_fails_the_start_and_leaves_nothing(tiny_llama_dir, tmp_path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    before = children(os.getpid())
    with pytest.raises(Exception, match="not a readable safetensors file"):
        make_llm(broken, 2)
    assert children(os.getpid()) == before
    llm = make_llm(tiny_llama_dir, 2)  # the process can start another one afterwards
    try:
        assert completions(llm, ["Hello"], GREEDY)
    finally:
        llm.engine.shutdown()
