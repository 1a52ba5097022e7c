"""Run bfloat16 kernels on a chosen path: "dot" (vdpbf16ps pair dot products) or "widen" (bfloat16 widened to
float32 for FMAs), and for attention's many-row loops also "tiles" (AMX tile products, where the CPU has them).
All must give the same results within bfloat16's tolerance, whichever one a CPU picks."""

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pagedllm.kernels import cpu_isa, load_cpu_kernels

BF16_PATHS = ("dot", "widen")
ATTENTION_PATHS = BF16_PATHS + ("tiles",)


@contextmanager
def bf16_matmul_path(path: str | None) -> Iterator[None]:
    """bfloat16 matmuls and attention take `path` inside; None leaves the measured choice. "dot" skips the test
    where the CPU has no AVX512-BF16 (its build widens every bfloat16 product)."""
    kernels = load_cpu_kernels()
    if path is None or kernels is None:
        yield
        return
    if path == "dot" and "avx512_bf16" not in cpu_isa():
        pytest.skip("no vdpbf16ps on this CPU (it needs AVX512-BF16): bfloat16 widens to float32")
    kernels.set_bf16_matmul_path(path)
    assert kernels.bf16_matmul_path() == path
    try:
        yield
    finally:
        kernels.set_bf16_matmul_path("auto")


@contextmanager
def attention_path(path: str) -> Iterator[None]:
    """bfloat16 attention's many-row loops take `path` inside (one of ATTENTION_PATHS); "tiles" skips the test
    where this build or OS has no AMX tiles."""
    kernels = load_cpu_kernels()
    if path == "tiles" and not kernels.has_amx_tiles():
        pytest.skip("no AMX tiles on this CPU, build or OS")
    kernels.set_attention_tiles(path == "tiles")
    assert kernels.attention_tiles() == (path == "tiles")
    try:
        with bf16_matmul_path(None if path == "tiles" else path):
            yield
    finally:
        kernels.set_attention_tiles(True)
