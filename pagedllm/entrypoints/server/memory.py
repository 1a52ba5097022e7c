"""Hand the memory a burst left in the C allocator's free lists back to the OS when the engine idles.

Each step allocates activations whose size follows the batch; glibc keeps freed chunks in its
per-thread arenas for reuse, so the server's resident memory climbs to the high-water mark of
every batch shape seen so far, a little more after each burst. `malloc_trim(0)` returns the free
pages (anywhere in the heaps, not only at the top) and costs a few milliseconds, paid once per
busy-to-idle transition, when no request is waiting for the engine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable


def freed_memory_releaser() -> Callable[[], None] | None:
    """A function releasing freed heap memory to the OS, or None where the C library has none (not glibc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)
