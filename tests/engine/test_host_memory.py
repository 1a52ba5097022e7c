"""keep_freed_memory: a step's freed buffers are reused, not faulted in again from the OS every step;
release_freed_memory: what loading left free in the heap goes back to the OS."""

import sys

import pytest
import torch

from pagedllm.engine.host_memory import keep_freed_memory, minor_page_faults, release_freed_memory


def _layer_like_step(weights: list[torch.Tensor], rows: int) -> None:
    """A prompt step's allocation pattern: 2048-row activations and matmul outputs of 2-12 MiB, freed as it goes."""
    qkv_w, o_w, gate_up_w, down_w = weights
    h = torch.randn(rows, 576)
    for _ in range(4):
        qkv = h @ qkv_w.T
        h = h + qkv[:, :576].contiguous() @ o_w.T
        gate_up = h @ gate_up_w.T
        h = h + (torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]) @ down_w.T


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's (Linux)")
def test_steps_after_the_first_reuse_freed_buffers_without_page_faults():
    assert keep_freed_memory()
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=generator) for o, i in [(960, 576), (576, 576), (3072, 576), (576, 1536)]]
    _layer_like_step(weights, 2048)  # the heap grows to a step's high-water mark once
    before = minor_page_faults()
    for _ in range(5):
        _layer_like_step(weights, 2048)
    # with glibc's defaults each of these steps faulted 13,000-28,000 pages in again (measured)
    assert minor_page_faults() - before < 10_000


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's (Linux)")
def test_memory_freed_while_loading_goes_back_to_the_os():
    assert keep_freed_memory()  # as during steps: freed buffers of a few MiB stay in the heap
    buffers = [torch.ones(1 << 18) for _ in range(256)]  # 256 MiB in 1 MiB buffers, like a load's temporaries
    held = _resident_mib()
    del buffers
    assert _resident_mib() > held - 64  # freed, but still the process's
    assert release_freed_memory()
    assert _resident_mib() < held - 192

