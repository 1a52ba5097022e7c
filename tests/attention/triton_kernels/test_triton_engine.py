"""The Triton attention inside the runner and the engine: under the interpreter on the CPU here, compiled on
CUDA (with real CUDA graphs) when scripts/gpu_check.sh sets PAGEDLLM_TRITON_DEVICE=cuda."""

import random

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.engine.cuda_graphs import DecodeGraphs
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.sampling_params import SamplingParams


def engine_tokens(model_dir, device: str, impl: str, prompts: list[list[int]], **options) -> list[list[int]]:
    config = EngineConfig(model=str(model_dir), num_blocks=64, block_size=4, max_num_batched_tokens=24,
                          dtype="float32", device=device, attention_impl=impl, max_model_len=64, **options)
    engine = LLMEngine(config)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(None, p, params) for p in prompts]
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.kv.num_used_blocks == 0
    return [done[i].outputs[0].token_ids for i in ids]


def test_engine_on_triton_gives_the_reference_greedy_tokens(tiny_llama_dir, device):
    """Chunked prefill (prompts longer than the step budget), a shared prefix, decode batches."""
    rng = random.Random(7)
    shared = [rng.randrange(5, 384) for _ in range(9)]
    prompts = [shared + [rng.randrange(5, 384) for _ in range(n)] for n in (3, 20, 1)] + [[11, 12]]
    expected = engine_tokens(tiny_llama_dir, "cpu", "reference", prompts)
    assert engine_tokens(tiny_llama_dir, str(device), "triton", prompts) == expected


def run_requests(model_dir, device: str, impl: str, requests: list, **options) -> tuple[list, int]:
    """Every (prompt, params) to the end: each request's completions' tokens, and the preemptions taken."""
    config = EngineConfig(model=str(model_dir), block_size=4, max_num_batched_tokens=32, dtype="float32",
                          device=device, attention_impl=impl, max_model_len=64, **options)  # fmt: skip
    engine = LLMEngine(config)
    ids = [engine.add_request(None, prompt, params) for prompt, params in requests]
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    assert engine.kv.num_used_blocks == 0
    return [[c.token_ids for c in done[i].outputs] for i in ids], engine.scheduler.num_preemptions


def test_shared_blocks_and_swap_on_triton_match_the_reference_path(tiny_llama_dir, device, monkeypatch):
    """n > 1 with seeds and beam search (forks that share blocks, copy-on-write through the block-copy
    kernel, K/V through the KV-write kernel), and swap preemption in a small pool: the same tokens as the
    reference attention on the same device."""
    import pagedllm.attention.triton as triton_ops

    calls = []
    for name in ("triton_copy_blocks", "triton_write_kv"):
        kernel = getattr(triton_ops, name)
        monkeypatch.setattr(triton_ops, name, lambda *a, name=name, kernel=kernel: calls.append(name) or kernel(*a))
    rng = random.Random(3)
    prompts = [[rng.randrange(5, 384) for _ in range(n)] for n in (7, 10, 5, 9)]
    sampled = SamplingParams(n=3, temperature=0.8, seed=11, max_tokens=6, ignore_eos=True)
    beam = SamplingParams(n=2, use_beam_search=True, temperature=0.0, max_tokens=6)
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    forks = [(prompts[0], sampled), (prompts[1], beam)]
    swaps = [(p, greedy) for p in prompts]
    for requests, options in ((forks, dict(num_blocks=64)), (swaps, dict(num_blocks=12, preemption_mode="swap"))):
        expected, _ = run_requests(tiny_llama_dir, str(device), "reference", requests, **options)
        got, preemptions = run_requests(tiny_llama_dir, str(device), "triton", requests, **options)
        assert got == expected
        assert preemptions > 0 or requests is forks
    assert {"triton_copy_blocks", "triton_write_kv"} <= set(calls)  # the Triton kernels wrote and copied K/V


def test_padded_decode_step_equals_the_eager_step(tiny_llama_dir, device):
    """The CUDA-graph step (static buffers, padding rows, fixed plan) against the plain step: same logits,
    and the padding rows write nothing into the pool. On the CPU the padded step runs eagerly."""
    from pagedllm.model.loader import load_model

    model, config = load_model(tiny_llama_dir, torch.float32, device)
    runner = ModelRunner(model, config, 32, 4, torch.float32, "triton", device)
    tables = [[0, 1, 2], [3, 4, 5, 6], [7, 8]]
    prompts = [[5, 6, 7, 8, 9], [10 + i for i in range(11)], [40, 41]]
    runner.execute([SeqInput(p, 0, t) for p, t in zip(prompts, tables)])
    decode = [SeqInput([17 + i], len(p), t) for i, (p, t) in enumerate(zip(prompts, tables))]
    with torch.inference_mode():
        eager = runner.execute(decode)
        pool = [cache.clone() for cache in runner.kv_caches]
        runner.graphs = DecodeGraphs(runner, max_num_seqs=5, max_model_len=32, capture=device.type == "cuda")
        assert runner.graphs.sizes == [1, 2, 4, 8]
        step = runner.prepare(decode)
        assert runner.graphs.covers(step)
        padded = runner.execute(decode)
    torch.testing.assert_close(padded, eager, atol=1e-5, rtol=1e-5)
    for before, after in zip(pool, runner.kv_caches):
        # the same K/V rewritten at the same slots (a padded matmul may round differently on a GPU), and
        # nothing anywhere else: a padding row writing would change a slot by far more than 1e-5
        torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
        assert not after[:, :, 9:].any()  # blocks no sequence holds are still zero


def test_prefill_steps_are_not_replayed(tiny_llama_dir, device):
    from pagedllm.model.loader import load_model

    model, config = load_model(tiny_llama_dir, torch.float32, device)
    runner = ModelRunner(model, config, 16, 4, torch.float32, "triton", device)
    graphs = DecodeGraphs(runner, max_num_seqs=2, max_model_len=16, capture=device.type == "cuda")
    assert not graphs.covers(runner.prepare([SeqInput([5, 6], 0, [0])]))  # a prompt
    assert not graphs.covers(runner.prepare([SeqInput([5], 3, [0]), SeqInput([6], 3, [1]), SeqInput([7], 3, [2])]))
    assert not graphs.covers(runner.prepare([SeqInput([5], 3, [0], needs_logits=False)]))
    assert graphs.covers(runner.prepare([SeqInput([5], 3, [0]), SeqInput([6], 7, [1, 2])]))


def test_triton_on_the_cpu_needs_the_interpreter(tiny_llama_dir, device, monkeypatch):
    from pagedllm.errors import InvalidInputError
    from pagedllm.model.loader import load_model

    if device.type != "cpu":
        pytest.skip("checks the CPU's refusal; on CUDA the other tests here run the kernels")
    monkeypatch.delenv("TRITON_INTERPRET")  # triton's interpret knob reads the variable
    model, config = load_model(tiny_llama_dir, torch.float32, "cpu")
    with pytest.raises(InvalidInputError, match="needs a CUDA device"):
        ModelRunner(model, config, 16, 4, torch.float32, "triton", "cpu")


def test_the_attention_plan_crosses_once_per_step_not_per_layer(tiny_llama_dir, device):
    """The Triton plan's launch lists go over in one copy per eager step (a replayed CUDA graph needs none);
    a step with prompt rows has a second plan, the last layer's over the sampled rows alone."""
    from pagedllm.engine.device import record_transfers

    config = EngineConfig(model=str(tiny_llama_dir), num_blocks=64, block_size=4, max_num_batched_tokens=24,
                          dtype="float32", device=str(device), attention_impl="triton", max_model_len=64)
    engine = LLMEngine(config)
    for prompt in ([5, 6, 7, 8, 9, 10], [11, 12]):
        engine.add_request(None, prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    per_step = []
    while engine.has_unfinished_requests():
        with record_transfers() as log:
            engine.step()
        per_step.append([t.what for t in log])
    plan = [["step inputs", "attention plan", "sampled tokens"]]
    replayed = [["step inputs", "sampled tokens"]]
    assert per_step[0] == ["step inputs", "attention plan", "attention plan", "sampled tokens"]  # the prompts
    assert all(s in (plan + replayed if device.type == "cuda" else plan) for s in per_step[1:]), per_step
