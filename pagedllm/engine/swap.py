"""Swap space for preemption_mode="swap": a preempted sequence's K/V saved outside the pool, restored later."""

import torch

from pagedllm.attention.kv_cache import read_tokens, write_tokens


class SwapSpace:
    def __init__(self) -> None:
        self._saved: dict[str, list[torch.Tensor]] = {}  # seq id -> per layer [2, tokens, kv_heads, head_dim]

    def __len__(self) -> int:
        return len(self._saved)

    def save(self, seq_id: str, kv_caches: list[torch.Tensor], blocks: list[int], num_tokens: int) -> None:
        self._saved[seq_id] = [read_tokens(cache, blocks, num_tokens) for cache in kv_caches]

    def restore(self, seq_id: str, kv_caches: list[torch.Tensor], blocks: list[int]) -> None:
        for cache, rows in zip(kv_caches, self._saved.pop(seq_id)):
            write_tokens(cache, blocks, rows)

    def drop(self, seq_id: str) -> None:
        self._saved.pop(seq_id, None)
