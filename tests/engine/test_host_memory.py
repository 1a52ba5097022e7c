"""keep_freed_memory: a step's freed buffers are reused, not faulted in again from the OS every step."""

import io
import sys

import pytest
import torch

from pagedllm.engine import host_memory
from pagedllm.engine.host_memory import keep_freed_memory, minor_page_faults


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
    # with glibc's defaults each of these steps faulted 13,000-28,000 pages in again (measured), 65,000 or more in
    # five; kept, they fault almost none, though the kernel sometimes takes pages back in the background: up to
    # 12,000 faults were seen in five steps
    assert minor_page_faults() - before < 30_000


def test_a_pool_larger_than_the_available_memory_is_refused_before_it_is_allocated(tiny_llama_dir, monkeypatch):
    from pagedllm.config import EngineConfig
    from pagedllm.engine import pool_memory
    from pagedllm.engine.host_memory import available_bytes
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.errors import InvalidInputError

    assert available_bytes() > 0  # read from /proc/meminfo here
    monkeypatch.setattr(pool_memory, "available_bytes", lambda: 1 << 20)
    with pytest.raises(InvalidInputError, match=r"does not fit in this machine's 0.0 GiB of available memory"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), kv_cache_memory="8MiB"))


MEMINFO = "MemTotal:       8000000 kB\nMemFree:          100000 kB\nMemAvailable:     300000 kB\nBuffers: 1 kB\n"


def test_available_bytes_is_mem_available_in_kib(monkeypatch):
    """MemAvailable (not MemFree, which leaves out reclaimable page cache), and /proc/meminfo's kB are KiB."""
    monkeypatch.setattr(host_memory, "open", lambda *a, **k: io.StringIO(MEMINFO), raising=False)
    assert host_memory.available_bytes() == 300000 * 1024


def test_available_bytes_is_none_without_the_line(monkeypatch):
    monkeypatch.setattr(host_memory, "open", lambda *a, **k: io.StringIO("MemTotal: 1 kB\n"), raising=False)
    assert host_memory.available_bytes() is None


def test_minor_page_faults_count_first_touches():
    import mmap

    before = host_memory.minor_page_faults()
    with mmap.mmap(-1, 32 << 20) as m:  # 8192 fresh pages, each faulted in on its first write
        for i in range(0, 32 << 20, 4096):
            m[i] = 1
    assert host_memory.minor_page_faults() - before >= 4000


