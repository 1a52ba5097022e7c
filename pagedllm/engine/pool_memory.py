"""The KV pool's size in bytes, and how many blocks fit in a memory budget (the CPU's kv_cache_memory,
or what the GPU profile leaves: pool_sizing.py)."""

import torch

from pagedllm.attention import kv_cache_bytes_per_block
from pagedllm.config import parse_memory_size
from pagedllm.engine.host_memory import available_bytes
from pagedllm.errors import InvalidInputError
from pagedllm.model.config import ModelConfig


def block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """One KV block's size: every layer's K and V."""
    return kv_cache_bytes_per_block(config.num_layers, block_size, config.num_kv_heads, config.head_dim, dtype)


def pool_bytes(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype) -> int:
    """The KV pool's size: every layer's K and V of num_blocks blocks."""
    return num_blocks * block_bytes(config, block_size, dtype)


def check_pool_fits(size: int, what: str = "a KV pool") -> None:
    """A pool larger than the free memory would be zeroed page by page until the OS kills the process."""
    available = available_bytes()
    if available is not None and size > available:
        raise InvalidInputError(f"{what} of {size / 2**30:.1f} GiB does not fit in this machine's "
                                f"{available / 2**30:.1f} GiB of available memory; lower kv_cache_memory or num_blocks")


def num_blocks_for_bytes(budget_bytes: int, bytes_per_block: int, budget: str = "the KV pool") -> int:
    """How many whole blocks fit in budget_bytes; `budget` names them in the error when not one does."""
    num_blocks = budget_bytes // bytes_per_block
    if num_blocks < 1:
        raise InvalidInputError(f"{budget} ({budget_bytes} bytes) is smaller than one KV block "
                                f"({bytes_per_block} bytes)")
    return num_blocks


def num_blocks_for_memory(config: ModelConfig, block_size: int, dtype: torch.dtype, budget: str | int) -> int:
    """How many KV blocks fit in a memory budget such as kv_cache_memory (all layers, K and V)."""
    return num_blocks_for_bytes(parse_memory_size(budget), block_bytes(config, block_size, dtype),
                                f"KV cache budget {budget}")
