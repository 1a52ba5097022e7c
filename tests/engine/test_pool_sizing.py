"""KV pool sizing from gpu_memory_utilization: the arithmetic, the profile step, and the wiring (on the CPU)."""

import pytest
import torch

from pagedllm.attention import kv_cache_bytes_per_block
from pagedllm.config import EngineConfig
from pagedllm.engine import pool_sizing
from pagedllm.engine.pool_memory import num_blocks_for_bytes
from pagedllm.engine.pool_sizing import GpuMemory, kv_pool_bytes, profile_step_lengths
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
