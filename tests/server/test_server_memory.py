"""The server's memory policy: freed heap pages go back to the OS, oneDNN's primitive cache is bounded."""

from __future__ import annotations

import os
import platform

import pytest

from pagedllm.entrypoints.server import memory


def test_freed_memory_releaser_on_glibc() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip(f"malloc_trim is glibc's; this C library is {platform.libc_ver()[0] or 'unknown'}")
    release = memory.freed_memory_releaser()
    assert release is not None and release() in (0, 1)


def test_onednn_cache_is_bounded_unless_the_environment_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(memory.ONEDNN_CACHE_ENV, raising=False)
    memory.bound_onednn_cache()
    assert os.environ[memory.ONEDNN_CACHE_ENV] == str(memory.SERVER_ONEDNN_CACHE)
    monkeypatch.setenv(memory.ONEDNN_CACHE_ENV, "512")
    memory.bound_onednn_cache()
    assert os.environ[memory.ONEDNN_CACHE_ENV] == "512"
