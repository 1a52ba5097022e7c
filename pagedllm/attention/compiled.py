"""The compiled CPU path ("compiled"): one C++ call per layer for the step's whole mixed batch.

The kernel (pagedllm/csrc/paged_attention.cpp, explained in docs/attention.md) reads K and V through the
block tables where they lie: no gather, no padding. The KV write and the block copy are compiled too.
"""

from types import ModuleType

import torch

from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.kernels import load_cpu_kernels


def kernels() -> ModuleType:
    module = load_cpu_kernels()
    if module is None:
        raise RuntimeError("the compiled CPU kernels are not available on this machine (see the log)")
    return module


def compiled_covers(head_dim: int, dtype: torch.dtype, device_type: str = "cpu") -> bool:
    """Whether the compiled kernels loaded here and have a path for this head size, dtype and device."""
    module = load_cpu_kernels()
    return (
        module is not None
        and device_type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and module.supports_head_dim(head_dim)
    )


def compiled_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, partition_size: int = 0
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] (token rows may be strided) -> contiguous, same shape.

    partition_size > 0 splits every key range longer than that across threads (tests use it to exercise
    the merge); 0 lets the kernel split only when threads would otherwise idle.
    """
    out = torch.empty(query.shape, dtype=query.dtype)
    kernels().paged_attention(
        out, query, kv_cache, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale, partition_size
    )
    return out


def compiled_write_kv(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """key, value: [num_tokens, num_kv_heads, head_dim] (token rows may be strided); slot -1 = skip."""
    kernels().write_kv(key, value, kv_cache, slot_mapping)


def compiled_copy_blocks(kv_caches: list[torch.Tensor], copies: list[tuple[int, int]]) -> None:
    """Copy block src to dst in every layer, pair after pair (the manager never names a destination as a
    later source within one step: copy-on-write targets are fresh blocks)."""
    src = torch.tensor([s for s, _ in copies], dtype=torch.int64)
    dst = torch.tensor([d for _, d in copies], dtype=torch.int64)
    kernels().copy_blocks(kv_caches, src, dst)
