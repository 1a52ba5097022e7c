"""Run bfloat16 kernels on a chosen path: "dot" (vdpbf16ps pair dot products) or "widen" (bfloat16 widened to
float32 for FMAs). Both must give the same results within bfloat16's tolerance, whichever one a CPU measures
faster."""

from collections.abc import Iterator
from contextlib import contextmanager

from pagedllm.kernels import load_cpu_kernels

BF16_PATHS = ("dot", "widen")


@contextmanager
def bf16_matmul_path(path: str | None) -> Iterator[None]:
    """bfloat16 matmuls and attention take `path` inside; None leaves the measured choice."""
    kernels = load_cpu_kernels()
    if path is None or kernels is None:
        yield
        return
    kernels.set_bf16_matmul_path(path)
    assert kernels.bf16_matmul_path() == path
    try:
        yield
    finally:
        kernels.set_bf16_matmul_path("auto")
