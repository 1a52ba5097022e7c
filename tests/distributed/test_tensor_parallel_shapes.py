"""Tensor parallelism on the CPU (gloo): swap, other shapes (size 3, a replicated KV head, K/V biases, a GGUF
file, a vocabulary that does not divide, a step message past its first broadcast), bad splits, the threads.
Each test starts and stops its own engine (one tensor-parallel engine per process at a time)."""

import os
import re

import pytest
import torch
from tp_helpers import children, completions, make_llm, same_completions

from pagedllm import SamplingParams
from pagedllm.distributed import startup
from pagedllm.distributed.message import Kind, StepMessage, encode
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


def test_structured_outputs_over_2_ranks_equal_size_1(tiny_llama_dir) -> None:
    """A grammar's rows need full logits, which the ranks gather (not the greedy picks they send otherwise)."""
    params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, structured_outputs={"regex": "[a-e]{3}-[0-9]+"})
    expected = completions(make_llm(tiny_llama_dir, 1), PROMPTS, params)
    llm = make_llm(tiny_llama_dir, 2)
    try:
        got = completions(llm, PROMPTS, params)
        assert same_completions(got, expected, logprob_tol=1e-4)
        texts = [llm.get_tokenizer().decode(ids) for request in got for ids, _ in request]
        assert all(re.fullmatch("[a-e]{3}-[0-9]+", text) for text in texts), texts
    finally:
        llm.engine.shutdown()


def same_greedy_completions_as_size_1(model) -> None:
    expected = completions(make_llm(model, 1), PROMPTS, GREEDY)
    llm = make_llm(model, 2)
    try:
        assert same_completions(completions(llm, PROMPTS, GREEDY), expected, logprob_tol=1e-4)
    finally:
        llm.engine.shutdown()


def test_qwen2_with_q_k_and_v_biases(tmp_path_factory) -> None:
    """Each rank holds its heads' slice of every projection's bias."""
    from tiny import save_tiny_dir

    same_greedy_completions_as_size_1(save_tiny_dir(tmp_path_factory.mktemp("tiny_qwen2"), "qwen2", seed=5))


def test_a_gguf_model(tmp_path_factory) -> None:
    """GGUF weights are read whole, then sliced per rank (the loader's other branch)."""
    from gguf_writer import write_gguf
    from tiny import make_hf_model, make_tiny_tokenizer

    path = tmp_path_factory.mktemp("tiny_gguf") / "tiny.gguf"
    same_greedy_completions_as_size_1(write_gguf(make_hf_model("llama", seed=6), path, tokenizer=make_tiny_tokenizer()))


def test_a_qwen3_gguf_with_a_rope_freqs_tensor(tmp_path_factory) -> None:
    """Every rank holds the q/k norms whole, and reads the rope scaling from the file's rope_freqs tensor."""
    from gguf_writer import write_gguf
    from tiny import make_hf_model, make_tiny_tokenizer

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}
    hf = make_hf_model("qwen3", seed=8, head_dim=32, rope_scaling=rope)
    path = tmp_path_factory.mktemp("tiny_qwen3") / "tiny.gguf"
    same_greedy_completions_as_size_1(write_gguf(hf, path, tokenizer=make_tiny_tokenizer()))


def test_a_vocabulary_that_does_not_divide(tmp_path_factory) -> None:
    """385 tokens over 2 ranks: the last rank's slice has a padding column, which counts nowhere (not in the full
    rows, not in a greedy row's pick or logsumexp)."""
    from tiny import save_tiny_dir

    model = save_tiny_dir(tmp_path_factory.mktemp("tiny_v385"), seed=7, vocab_size=385)
    step = [SeqInput([5, 17, 99, 3, 250, 8], 0, [0, 1]), SeqInput([7, 7, 300], 0, [2])]
    expected = make_llm(model, 1).engine.executor.execute([], step, [False, False]).full
    llm = make_llm(model, 2)
    try:
        got = llm.engine.executor.execute([], step, [True, False])
        assert got.full.shape == (1, 385)
        torch.testing.assert_close(got.full, expected[1:], atol=1e-4, rtol=0)
        assert list(got.greedy) == [0]  # the logits row it was asked for
        pick = got.greedy[0]
        assert pick.token_id == int(expected[0].argmax())
        assert pick.logprob == pytest.approx(float(expected[0].log_softmax(-1)[pick.token_id]), abs=1e-5)
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize(("num_copies", "words"), [(2038, 4096), (2600, 5220)])
def test_a_step_message_longer_than_its_first_broadcast(tiny_llama_dir, monkeypatch, num_copies, words) -> None:
    """The first broadcast carries the length and 4095 words, a second one the rest: at 4096 words, one word."""
    monkeypatch.setenv("PAGEDLLM_TP_TIMEOUT", "5")
    copies = [(100, 101)] * num_copies
    step = [SeqInput([5, 17, 99, 3, 250], 0, [0, 1, 2])]
    assert len(encode(StepMessage(Kind.STEP, copies, [], step, [False]))) == words
    expected = make_llm(tiny_llama_dir, 1).engine.executor.execute(copies, step, [False]).full
    llm = make_llm(tiny_llama_dir, 2)
    try:
        torch.testing.assert_close(llm.engine.executor.execute(copies, step, [False]).full, expected, atol=1e-4, rtol=0)
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
    monkeypatch.setattr(startup, "LocalWorkers", lambda *args, **kwargs: pytest.fail("workers were spawned"))
    before = children(os.getpid())
    with pytest.raises(InvalidInputError, match="PAGEDLLM_TP_TIMEOUT must be a positive number"):
        make_llm(tiny_llama_dir, 2)
    assert children(os.getpid()) == before


def test_each_rank_gets_its_share_of_the_threads(tiny_llama_dir, monkeypatch) -> None:
    """The spec sent to the workers holds each rank's share, and a rank takes it (rank 0 here, through the same
    build_rank the workers run)."""
    shared = []
    share_spec = startup.share_spec
    monkeypatch.setattr(startup, "share_spec", lambda rank, spec: shared.append(spec) or share_spec(rank, spec))
    threads = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        llm = make_llm(tiny_llama_dir, 2)
        assert torch.get_num_threads() == 2
        llm.engine.shutdown()
    finally:
        torch.set_num_threads(threads)
    assert [spec.threads for spec in shared] == [2]


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
