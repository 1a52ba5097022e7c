"""Which attention implementation runs: the names `paged_attention` accepts, and what "auto" stands for
on a device for a model's head size and dtype."""

import logging

import torch

from pagedllm.errors import InvalidInputError

logger = logging.getLogger("pagedllm")

IMPLS = ("auto", "compiled", "fast", "reference", "blockwise", "triton")


def resolve_attention_impl(impl: str, head_dim: int, dtype: torch.dtype, device: torch.device | None = None) -> str:
    """Validate early (at construction, not mid-step) and decide what "auto" means for this model here:
    on CUDA the Triton kernels; on the CPU the compiled kernels when they loaded and cover the head size and
    dtype, else the torch path."""
    if impl not in IMPLS:
        raise InvalidInputError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if device is not None and device.type == "cuda":
        return _cuda_attention_impl(impl)
    if impl == "triton":
        return _triton_on_cpu()
    return _cpu_attention_impl(impl, head_dim, dtype)


def _cpu_attention_impl(impl: str, head_dim: int, dtype: torch.dtype) -> str:
    from pagedllm.attention.compiled import compiled_covers
    from pagedllm.kernels import load_cpu_kernels

    if impl not in ("auto", "compiled"):
        return impl
    if compiled_covers(head_dim, dtype):
        return "compiled"
    loaded = load_cpu_kernels() is not None
    if impl == "compiled":
        why = f"have no path for head_dim {head_dim}, {dtype}" if loaded else "did not load (see the log)"
        raise InvalidInputError(f"the compiled CPU kernels are unavailable: they {why}")
    if loaded:
        logger.info("compiled kernels have no path for head_dim %d / %s; using the torch attention", head_dim, dtype)
    return "fast"


def _cuda_attention_impl(impl: str) -> str:
    """On CUDA: the Triton kernels, or the torch reference (slow, for checking); the other paths are CPU-only."""
    from pagedllm.attention.triton import is_available

    if impl in ("compiled", "fast", "blockwise"):
        raise InvalidInputError(f"attention impl {impl!r} runs on the CPU only; on CUDA use triton or reference")
    if impl == "reference":
        return impl
    if not is_available():
        raise InvalidInputError("running on CUDA needs the triton package (pip install triton)")
    return "triton"


def _triton_on_cpu() -> str:
    """The Triton kernels run on CPU tensors only under the interpreter (TRITON_INTERPRET=1, for tests)."""
    from pagedllm.attention.triton import is_available

    if is_available():
        from pagedllm.attention.triton.loader import interpreting

        if interpreting():
            return "triton"
    raise InvalidInputError("attention impl 'triton' needs a CUDA device (or TRITON_INTERPRET=1 for tests)")
