"""Swap space for preemption_mode="swap": a preempted sequence's K/V saved outside the pool, restored later.

The scheduler decides when (it owns every sequence's life); this only moves the tensors. With the pool on a
GPU, the saved K/V lie in pinned host memory: both copies are asynchronous and ordered on the device's
stream with the steps that reuse or refill the blocks."""

from typing import Protocol

import torch

from pagedllm.attention.kv_cache import read_tokens, write_tokens
from pagedllm.engine.device import current, to_device, to_host


class SwapStore(Protocol):
    """What the scheduler needs from a swap space (tests pass a fake)."""

    def __contains__(self, seq_id: object) -> bool: ...
    def __len__(self) -> int: ...
    @property
    def tokens_held(self) -> int: ...
    def save(self, seq_id: int, blocks: list[int], num_tokens: int) -> None: ...
    def restore(self, seq_id: int, blocks: list[int]) -> None: ...
    def drop(self, seq_id: int) -> None: ...


class SwapSpace:
    def __init__(self, kv_caches: list[torch.Tensor]) -> None:
        self.kv_caches = kv_caches
        self._saved: dict[int, list[torch.Tensor]] = {}  # seq id -> per layer [2, tokens, kv_heads, head_dim]

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._saved

    def __len__(self) -> int:
        return len(self._saved)

    @property
    def tokens_held(self) -> int:
        """Tokens of K/V saved here, over every swapped-out sequence."""
        return sum(rows[0].shape[1] for rows in self._saved.values())

    def save(self, seq_id: int, blocks: list[int], num_tokens: int) -> None:
        self._saved[seq_id] = [
            to_host(read_tokens(cache, blocks, num_tokens), "swap out", pinned=True) for cache in self.kv_caches
        ]

    def restore(self, seq_id: int, blocks: list[int]) -> None:
        for cache, rows in zip(self.kv_caches, self._saved.pop(seq_id)):
            with current(cache.device):  # write_tokens launches the Triton KV write on CUDA
                write_tokens(cache, blocks, to_device(rows, cache.device, "swap in"))

    def drop(self, seq_id: int) -> None:
        self._saved.pop(seq_id, None)
