"""KV pool sizing from gpu_memory_utilization: the arithmetic, the profile step, and the wiring (on the CPU)."""

import pytest
import torch

from pagedllm.attention import kv_cache_bytes_per_block
from pagedllm.config import EngineConfig
from pagedllm.engine import pool_sizing
from pagedllm.engine.pool_memory import num_blocks_for_bytes
from pagedllm.engine.pool_sizing import GpuMemory, kv_pool_bytes, measure_gpu_memory, profile_step_lengths
from pagedllm.errors import InvalidInputError

GIB = 2**30


def test_the_pool_gets_what_is_left_under_the_fraction():
    memory = GpuMemory(total=80 * GIB, peak_torch=10 * GIB, non_torch=GIB)
    assert kv_pool_bytes(memory, 0.9) == int(72 * GIB) - 11 * GIB
    assert kv_pool_bytes(memory, 1.0) == 69 * GIB


def test_nothing_left_is_an_error_that_names_the_knobs():
    memory = GpuMemory(total=16 * GIB, peak_torch=14 * GIB, non_torch=GIB)
    with pytest.raises(InvalidInputError, match="raise gpu_memory_utilization"):
        kv_pool_bytes(memory, 0.9)


def test_blocks_from_bytes():
    assert num_blocks_for_bytes(10 * 4096 + 4095, 4096) == 10
    with pytest.raises(InvalidInputError, match="smaller than one KV block"):
        num_blocks_for_bytes(4095, 4096)


@pytest.mark.parametrize("budget, seqs, max_len, expected", [
    (1024, 64, 8192, [16] * 64),
    (10, 64, 8192, [1] * 10),
    (1000, 3, 100, [100] * 10),  # no sequence longer than max_model_len: more sequences than max_num_seqs
    (7, 3, 8192, [3, 2, 2]),
])
def test_the_profile_step_is_the_largest_step(budget, seqs, max_len, expected):
    lengths = profile_step_lengths(budget, seqs, max_len)
    assert lengths == expected and sum(lengths) == budget and max(lengths) <= max_len


def test_gpu_pool_blocks_profiles_one_step_and_sizes_from_the_measure(tiny_llama_dir, monkeypatch):
    """The profile step runs for real (here on the CPU); only the GPU's memory readings are faked."""
    from pagedllm.model.loader import load_model

    model, config = load_model(tiny_llama_dir, torch.float32, "cpu")
    limits = EngineConfig(block_size=4, max_num_batched_tokens=40, max_num_seqs=3, gpu_memory_utilization=0.5)
    per_block = kv_cache_bytes_per_block(config.num_layers, 4, config.num_kv_heads, config.head_dim, torch.float32)
    profiled = []

    def fake_measure(device, run_step):
        profiled.append(run_step())
        return GpuMemory(total=1000 * per_block, peak_torch=100 * per_block, non_torch=50 * per_block)

    monkeypatch.setattr(pool_sizing, "measure_gpu_memory", fake_measure)
    blocks = pool_sizing.gpu_pool_blocks(model, config, limits, torch.float32, torch.device("cpu"), max_model_len=64)
    assert blocks == 500 - 150
    assert profiled == [(4 + 4 + 4) * per_block]  # prompts of 14, 13, 13 tokens: 4 blocks of 4 each


def test_nothing_left_exactly_is_the_utilization_error():
    memory = GpuMemory(total=10 * GIB, peak_torch=8 * GIB, non_torch=GIB)
    with pytest.raises(InvalidInputError, match="raise gpu_memory_utilization"):
        kv_pool_bytes(memory, 0.9)  # 9 GiB budget - 8 - 1 = 0 bytes left
    assert kv_pool_bytes(GpuMemory(10 * GIB, 8 * GIB, GIB - 1), 0.9) == 1


@pytest.mark.parametrize("budget, seqs, max_len", [(1001, 3, 100), (250, 1, 100), (8192, 256, 2048)])
def test_no_profiled_prompt_is_longer_than_max_model_len(budget, seqs, max_len):
    lengths = profile_step_lengths(budget, seqs, max_len)
    assert sum(lengths) == budget and max(lengths) <= max_len


def test_measure_subtracts_the_profile_pool_and_counts_only_memory_outside_torch(monkeypatch):
    cuda = torch.cuda
    calls = []
    monkeypatch.setattr(cuda, "empty_cache", lambda: calls.append("empty_cache"))
    monkeypatch.setattr(cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: 30 * GIB)
    monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (40 * GIB, 80 * GIB))  # (free, total)
    monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: 34 * GIB)

    def run_step():
        calls.append("step")
        return 4 * GIB  # the temporary pool of the profile step

    memory = measure_gpu_memory(torch.device("cuda", 0), run_step)
    # peak 30 GiB of which 4 are the temporary pool; 40 GiB in use, 34 of it torch's: 6 outside torch
    assert memory == GpuMemory(total=80 * GIB, peak_torch=26 * GIB, non_torch=6 * GIB)
    assert calls.index("reset") < calls.index("step") < calls.index("sync")


def test_a_pool_just_over_the_available_memory_is_refused_and_one_that_fits_is_not(monkeypatch):
    from pagedllm.engine import pool_memory

    monkeypatch.setattr(pool_memory, "available_bytes", lambda: 4 * GIB)
    pool_memory.check_pool_fits(4 * GIB)
    with pytest.raises(InvalidInputError, match="does not fit"):
        pool_memory.check_pool_fits(4 * GIB + 1)
    monkeypatch.setattr(pool_memory, "available_bytes", lambda: None)  # unknown: no check
    pool_memory.check_pool_fits(1 << 60)
