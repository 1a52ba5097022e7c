"""How many KV blocks the pool gets on a GPU, from gpu_memory_utilization (vLLM's meaning).

The engine may use `utilization` of the GPU's total memory. Out of that come the memory used outside
torch's allocator (the CUDA context, other processes), the weights and the activations of the largest
step (measured: one forward pass, its peak); what is left is the KV pool. The arithmetic is a pure
function (kv_pool_bytes) so it is tested on the CPU; measure_gpu_memory runs the profile on the GPU.
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from pagedllm.engine.pool_memory import block_bytes, num_blocks_for_bytes
from pagedllm.errors import InvalidInputError
from pagedllm.kv.block_table import blocks_needed
from pagedllm.model.config import ModelConfig

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig

logger = logging.getLogger("pagedllm")


@dataclass(frozen=True, slots=True)
class GpuMemory:
    """Bytes, as measured after the profile step."""

    total: int  # the device's memory
    peak_torch: int  # torch's peak allocation during the profile step: weights + activations (profile pool excluded)
    non_torch: int  # in use outside torch's allocator: CUDA context, libraries, other processes


def kv_pool_bytes(memory: GpuMemory, utilization: float) -> int:
    """What is left for the KV pool under utilization * total; InvalidInputError when nothing is."""
    budget = int(memory.total * utilization)
    left = budget - memory.peak_torch - memory.non_torch
    if left <= 0:
        raise InvalidInputError(
            f"gpu_memory_utilization {utilization} allows {budget / 2**30:.2f} GiB, but the weights and the largest "
            f"step take {memory.peak_torch / 2**30:.2f} GiB and {memory.non_torch / 2**30:.2f} GiB is used outside "
            "torch: raise gpu_memory_utilization or lower max_num_batched_tokens / max_num_seqs"
        )
    return left


def profile_step_lengths(max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int) -> list[int]:
    """Prompt lengths of the largest step: max_num_batched_tokens tokens over as many sequences as may run
    (each needs a row of logits), none longer than max_model_len."""
    num_seqs = max(min(max_num_seqs, max_num_batched_tokens), -(-max_num_batched_tokens // max_model_len))
    base, extra = divmod(max_num_batched_tokens, num_seqs)
    return [base + (i < extra) for i in range(num_seqs)]


def measure_gpu_memory(device: torch.device, run_step: Callable[[], int]) -> GpuMemory:
    """Run the profile step (run_step returns the bytes of the temporary pool it used) and read the peak."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    profile_pool = run_step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - profile_pool
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, total - free - torch.cuda.memory_reserved(device))
    return GpuMemory(total, peak, non_torch)


def log_gpu_memory(memory: GpuMemory, utilization: float, pool_size: int) -> None:
    gib = 2**30
    logger.info(
        "GPU memory: %.1f GiB x gpu_memory_utilization %.2f = %.2f GiB; weights + largest step %.2f GiB, "
        "outside torch %.2f GiB; KV pool %.2f GiB",
        memory.total / gib, utilization, memory.total * utilization / gib, memory.peak_torch / gib,
        memory.non_torch / gib, pool_size / gib,
    )


def gpu_pool_blocks(
    model: torch.nn.Module,
    model_config: ModelConfig,
    config: "EngineConfig",
    dtype: torch.dtype,
    device: torch.device,
    max_model_len: int,
) -> int:
    """Profile the largest step (forward and sampling) on a temporary pool, then size the real pool."""
    block_size = config.block_size
    per_block = block_bytes(model_config, block_size, dtype)
    lengths = profile_step_lengths(config.max_num_batched_tokens, config.max_num_seqs, max_model_len)
    blocks = [blocks_needed(n, block_size) for n in lengths]

    def run_step() -> int:
        _profile_step(model, model_config, lengths, blocks, block_size, dtype, config.attention_impl, device)
        return sum(blocks) * per_block

    memory = measure_gpu_memory(device, run_step)
    pool = kv_pool_bytes(memory, config.gpu_memory_utilization)
    log_gpu_memory(memory, config.gpu_memory_utilization, pool)
    return num_blocks_for_bytes(pool, per_block)


def _profile_step(
    model: torch.nn.Module,
    model_config: ModelConfig,
    lengths: list[int],
    blocks: list[int],
    block_size: int,
    dtype: torch.dtype,
    attention_impl: str,
    device: torch.device,
) -> None:
    """One step of prompts `lengths` on a pool of exactly their blocks, then top-p sampling of every row."""
    from pagedllm.engine.model_runner import ModelRunner, SeqInput
    from pagedllm.engine.sampler import SamplingRow, make_generator, sample
    from pagedllm.sampling_params import SamplingParams

    runner = ModelRunner(model, model_config, sum(blocks), block_size, dtype, attention_impl, device)
    seqs, first = [], 0
    for length, num_blocks in zip(lengths, blocks):
        seqs.append(SeqInput([0] * length, 0, list(range(first, first + num_blocks))))
        first += num_blocks
    logits = runner.execute(seqs)
    params = SamplingParams(top_p=0.9, top_k=50)
    sample(logits, [SamplingRow(params, make_generator(0, i, device), [], []) for i in range(len(seqs))], set())
