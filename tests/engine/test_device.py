"""Device placement with the CPU as the device: which host<->device copies a step asks for, and nothing else.

Every copy goes through pagedllm.engine.device (to_device / to_host); record_transfers lists the calls,
which are made on the CPU too (there they copy nothing), so these tests see what a GPU run would copy.
"""

import argparse

import pytest
import torch

from pagedllm.attention import AttentionMetadata
from pagedllm.config import EngineConfig
from pagedllm.engine import device as device_mod
from pagedllm.engine.device import record_transfers, resolve_device
from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import SamplingParams
from test_engine import GREEDY, make_engine, random_prompts, run_all, tokens


def no_gpu(monkeypatch: pytest.MonkeyPatch, count: int = 0) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_is_the_cpu_without_a_gpu_and_cuda_with_one(monkeypatch):
    no_gpu(monkeypatch)
    assert resolve_device("auto") == torch.device("cpu")
    no_gpu(monkeypatch, count=2)
    assert resolve_device("auto") == torch.device("cuda", 0)


def test_forced_devices_and_their_errors(monkeypatch):
    no_gpu(monkeypatch)
    assert resolve_device("cpu") == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(InvalidInputError, match="no CUDA device"):
            resolve_device(name)
    no_gpu(monkeypatch, count=2)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(InvalidInputError, match="2 CUDA device"):
        resolve_device("cuda:2")
    with pytest.raises(InvalidInputError, match="device must be"):
        resolve_device("gpu")


def test_engine_with_cuda_but_no_gpu_fails_clearly(tiny_llama_dir, monkeypatch):
    no_gpu(monkeypatch)
    with pytest.raises(InvalidInputError, match="torch sees no CUDA device"):
        make_engine(tiny_llama_dir, device="cuda")


@pytest.mark.parametrize("bad", [dict(device="gpu"), dict(device="cuda:x"), dict(device="CPU"),
                                 dict(gpu_memory_utilization=0.0), dict(gpu_memory_utilization=1.5),
                                 dict(gpu_memory_utilization=True), dict(gpu_memory_utilization="0.5")])
def test_config_rejects_bad_device_options(bad):
    with pytest.raises(InvalidInputError):
        EngineConfig(**bad)


def test_device_options_on_the_command_line():
    from pagedllm.entrypoints.engine_args import add_engine_arguments, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--device", "cpu", "--gpu-memory-utilization", "0.5", "--enforce-eager"])
    config = engine_config_from_args(args)
    assert (config.device, config.gpu_memory_utilization, config.enforce_eager) == ("cpu", 0.5, True)
    defaults = EngineConfig()
    assert (defaults.device, defaults.gpu_memory_utilization, defaults.enforce_eager) == ("auto", 0.9, False)


def test_runner_sends_the_step_in_one_copy_with_the_values_build_gives(tiny_llama_dir):
    from pagedllm.model.loader import load_model

    model, config = load_model(tiny_llama_dir, torch.float32, "cpu")
    runner = ModelRunner(model, config, num_blocks=16, block_size=4, dtype=torch.float32, device="cpu")
    seqs = [SeqInput([5, 6, 7], 2, [3, 9]), SeqInput([8], 6, [1, 4]), SeqInput([9, 10], 0, [2], needs_logits=False)]
    with record_transfers() as log:
        step = runner.prepare(seqs)
    num_tokens, num_seqs, width, outputs = 6, 3, 2, 2
    parts = [num_tokens, num_tokens, outputs, num_tokens, num_seqs * width, num_seqs, num_seqs + 1]  # ids, pos, ...
    parts += [outputs, outputs * width, outputs, outputs + 1]  # the last layer's metadata of the output rows
    ints = sum(-(-n // 2) * 2 for n in parts)  # each part starts on a 16-byte line
    assert [(t.direction, t.what, t.nbytes) for t in log] == [("h2d", "step inputs", 8 * ints)]
    sent = [step.input_ids, step.positions, step.logits_rows, step.meta.slot_mapping, step.meta.block_tables]
    assert all(t.data_ptr() % 16 == 0 for t in sent), "a view at an odd offset: Triton would compile again"
    expected = AttentionMetadata.build([s.block_table for s in seqs], [2, 6, 0], [3, 1, 2], 4)
    expected_last = AttentionMetadata.build([s.block_table for s in seqs[:2]], [4, 6], [1, 1], 4)
    for name in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc"):
        assert torch.equal(getattr(step.meta, name), getattr(expected, name)), name
        assert torch.equal(getattr(step.logits_meta, name), getattr(expected_last, name)), name
    assert (step.logits_meta.seq_lens_list, step.logits_meta.query_lens_list) == ([5, 7], [1, 1])
    assert step.input_ids.tolist() == [5, 6, 7, 8, 9, 10]
    assert step.positions.tolist() == [2, 3, 4, 6, 0, 1]
    assert step.logits_rows.tolist() == [2, 3]


def test_packed_copy_keeps_values_and_starts_every_part_on_a_16_byte_line():
    parts = [torch.arange(n, dtype=torch.int64) * 7 + n for n in (3, 1, 0, 5, 2)]
    with record_transfers() as log:
        sent = device_mod.to_device_packed(parts, torch.device("cpu"), "step inputs")
    assert [t.nbytes for t in log] == [8 * (4 + 2 + 0 + 6 + 2)]
    assert [t.tolist() for t in sent] == [t.tolist() for t in parts]
    assert all(t.data_ptr() % 16 == 0 for t in sent)


def step_transfers(engine) -> list[list[tuple[str, str]]]:
    """Run the engine to the end; per step, the (direction, what) of every transfer it asked for."""
    per_step = []
    while engine.has_unfinished_requests():
        with record_transfers() as log:
            engine.step()
        per_step.append([(t.direction, t.what) for t in log])
    return per_step


def test_a_greedy_step_sends_its_inputs_and_brings_back_only_the_sampled_tokens(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    for prompt in random_prompts(4, seed=3, high=20):
        engine.add_request(None, prompt, SamplingParams(max_tokens=6, **GREEDY))
    steps = step_transfers(engine)
    assert len(steps) >= 6
    assert all(s == [("h2d", "step inputs"), ("d2h", "sampled tokens")] for s in steps), steps


def test_logprobs_add_one_copy_back(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    engine.add_request(None, [5, 6, 7], SamplingParams(max_tokens=3, logprobs=2, **GREEDY))
    steps = step_transfers(engine)
    assert steps == [[("h2d", "step inputs"), ("d2h", "sampled tokens"), ("d2h", "top logprobs")]] * 3


def test_random_sampling_sends_only_row_indices_and_parameters(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir)
    params = [SamplingParams(max_tokens=5, temperature=0.8, top_p=0.9, top_k=20, seed=1, ignore_eos=True),
              SamplingParams(max_tokens=5, temperature=0.7, min_p=0.1, presence_penalty=0.5, ignore_eos=True),
              SamplingParams(max_tokens=5, **GREEDY)]
    for prompt, p in zip(random_prompts(3, seed=4, high=12), params):
        engine.add_request(None, prompt, p)
    steps = step_transfers(engine)
    allowed_h2d = {"step inputs", "sampling rows", "sampling params", "penalty tokens"}
    for s in steps:
        assert s[0] == ("h2d", "step inputs")
        assert {what for d, what in s if d == "h2d"} <= allowed_h2d
        assert [what for d, what in s if d == "d2h"] == ["sampled tokens"]


def test_swap_moves_kv_only_when_a_sequence_is_preempted(tiny_llama_dir):
    engine = make_engine(tiny_llama_dir, num_blocks=12, preemption_mode="swap", max_num_batched_tokens=32)
    prompts = random_prompts(4, seed=5, low=8, high=12)
    for prompt in prompts:
        engine.add_request(None, prompt, SamplingParams(max_tokens=10, **GREEDY))
    whats = [what for s in step_transfers(engine) for _, what in s]
    assert engine.scheduler.num_preemptions > 0
    num_layers = engine.model_config.num_layers
    assert whats.count("swap out") == whats.count("swap in") > 0
    assert whats.count("swap out") % num_layers == 0
    assert set(whats) == {"step inputs", "sampled tokens", "swap out", "swap in"}


def test_recording_changes_nothing(tiny_llama_dir):
    prompts = random_prompts(3, seed=6, high=16)
    params = SamplingParams(max_tokens=6, temperature=0.9, seed=3, ignore_eos=True)
    plain = tokens(run_all(make_engine(tiny_llama_dir), prompts, params))
    with record_transfers() as log:
        recorded = tokens(run_all(make_engine(tiny_llama_dir), prompts, params))
    assert recorded == plain and log
    assert not device_mod._recorders  # the recorder is gone after its block


CUDA = torch.device("cuda", 0)


def test_attention_on_cuda_is_triton_or_the_reference(monkeypatch):
    """Decided from the device name alone, so it is checked here without a GPU."""
    from pagedllm.attention import triton as triton_pkg
    from pagedllm.attention import resolve_attention_impl

    monkeypatch.setattr(triton_pkg, "is_available", lambda: True)
    assert resolve_attention_impl("auto", 64, torch.bfloat16, CUDA) == "triton"
    assert resolve_attention_impl("triton", 64, torch.bfloat16, CUDA) == "triton"
    assert resolve_attention_impl("reference", 64, torch.bfloat16, CUDA) == "reference"
    for cpu_only in ("compiled", "fast", "blockwise"):
        with pytest.raises(InvalidInputError, match="CPU only"):
            resolve_attention_impl(cpu_only, 64, torch.bfloat16, CUDA)
    monkeypatch.setattr(triton_pkg, "is_available", lambda: False)
    with pytest.raises(InvalidInputError, match="needs the triton package"):
        resolve_attention_impl("auto", 64, torch.bfloat16, CUDA)


def test_auto_says_why_it_leaves_loaded_kernels_for_the_torch_path(caplog):
    """A dtype the kernels have no path for (float16): "auto" takes the torch path and says why, the only hint
    why such a model runs at the torch path's speed."""
    import logging

    from pagedllm.attention import resolve_attention_impl
    from pagedllm.kernels import load_cpu_kernels

    if load_cpu_kernels() is None:
        pytest.skip("no compiled kernels here")
    with caplog.at_level(logging.INFO, logger="pagedllm"):
        assert resolve_attention_impl("auto", 64, torch.float16) == "fast"
    assert any("no path for head_dim 64" in record.getMessage() for record in caplog.records)


def test_cpu_attention_choice_is_unchanged_by_the_device_argument():
    from pagedllm.attention import resolve_attention_impl

    for impl in ("auto", "fast", "reference", "blockwise"):
        assert resolve_attention_impl(impl, 64, torch.float32, torch.device("cpu")) == \
            resolve_attention_impl(impl, 64, torch.float32)


def test_auto_dtype_on_cuda_follows_the_gpu(monkeypatch):
    from pagedllm.model.dtype import describe_dtype, resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", device=CUDA) == torch.bfloat16
    assert describe_dtype("auto", torch.bfloat16, CUDA) == "bfloat16 (auto: the GPU has native bfloat16)"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", device=CUDA) == torch.float32
    assert resolve_dtype("float32", device=CUDA) == torch.float32
    assert resolve_dtype("auto", flags=["avx512_bf16"]) == torch.bfloat16  # the CPU still reads its flags


def test_triton_on_the_cpu_needs_the_interpreter(monkeypatch):
    """Refused at construction, not at the first step: the Triton kernels run on CPU tensors only interpreted."""
    from pagedllm.attention import resolve_attention_impl
    from pagedllm.attention import triton as triton_pkg
    from pagedllm.attention.triton import loader

    monkeypatch.setattr(triton_pkg, "is_available", lambda: True)
    monkeypatch.setattr(loader, "interpreting", lambda: False)
    with pytest.raises(InvalidInputError, match="needs a CUDA device"):
        resolve_attention_impl("triton", 64, torch.float32)
    monkeypatch.setattr(loader, "interpreting", lambda: True)
    assert resolve_attention_impl("triton", 64, torch.float32) == "triton"
    monkeypatch.setattr(triton_pkg, "is_available", lambda: False)
    with pytest.raises(InvalidInputError, match="needs a CUDA device"):
        resolve_attention_impl("triton", 64, torch.float32)


