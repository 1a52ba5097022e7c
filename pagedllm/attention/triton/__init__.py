"""Triton kernels for paged attention on NVIDIA GPUs, tested on the CPU under the Triton interpreter.

- triton_attention(query, kv_cache, meta, scale): the same contract as paged_attention's other impls.
- triton_write_kv(key, value, kv_cache, slot_mapping) and triton_copy_blocks(kv_caches, copies).

Importing this package does not import triton; the first call does (see loader.py), so the engine runs
without triton on a CPU.
"""

import importlib.util
from typing import Any

__all__ = ["is_available", "triton_attention", "triton_copy_blocks", "triton_write_kv"]

_ENTRY_POINTS = {
    "triton_attention": "pagedllm.attention.triton.attention",
    "triton_write_kv": "pagedllm.attention.triton.ops",
    "triton_copy_blocks": "pagedllm.attention.triton.ops",
}


def is_available() -> bool:
    """Whether the triton package is installed (it says nothing about a GPU)."""
    return importlib.util.find_spec("triton") is not None


def __getattr__(name: str) -> Any:
    if name in _ENTRY_POINTS:
        return getattr(importlib.import_module(_ENTRY_POINTS[name]), name)
    raise AttributeError(name)
