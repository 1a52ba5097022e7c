"""The model's calls into the compiled CPU kernels (pagedllm/csrc), one function per fused step.

Used only on the "compiled" path, which the runner picks when the kernels loaded (pagedllm.kernels);
each op has a torch counterpart in layers.py / pagedllm.attention that tests compare it with.
"""

import torch

from pagedllm.attention import AttentionMetadata
from pagedllm.attention.compiled import compiled_attention, compiled_write_kv, kernels


def add_rms_norm(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += hidden, then hidden = rms_norm(residual) * weight. Both [T, hidden]."""
    kernels().add_rms_norm(hidden, residual, weight, eps)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """In place on x: [T, heads, head_dim] (token rows may be strided); cos, sin: [T, 1, head_dim]."""
    kernels().rotary(x, cos, sin)


def head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place on x: [T, heads, head_dim] (token rows may be strided): each head = rms_norm(head) * weight."""
    kernels().head_rms_norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[T, 2 I] -> silu(gate) * up: [T, I]."""
    return kernels().silu_mul(gate_up.contiguous())


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    rows: torch.Tensor | None = None,
    rows_meta: AttentionMetadata | None = None,
) -> torch.Tensor:
    """Write the new K/V at meta.slot_mapping, then attend: q [T, H, D] -> [T, H, D] contiguous; with `rows`,
    only q[rows] attends, over rows_meta (meta cut to those rows) -> [len(rows), H, D]."""
    compiled_write_kv(k, v, kv_cache, meta.slot_mapping)
    if rows is not None:
        q, meta = q[rows], rows_meta
    return compiled_attention(q, kv_cache, meta, scale)
