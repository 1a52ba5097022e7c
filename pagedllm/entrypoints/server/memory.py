"""Keep the server's resident memory flat from burst to burst (docs/server.md, "Soak test").

Two things made it climb after every burst:
- Each step allocates activations whose size follows the batch; glibc keeps freed chunks in its
  per-thread arenas for reuse, so memory climbs to the high-water mark of every batch shape seen
  so far. `malloc_trim(0)` returns the free pages (anywhere in the heaps, not only at the top) and
  costs a few milliseconds, paid once per busy-to-idle transition, when no request is waiting.
- oneDNN, which runs the float32 projections, caches one primitive per matrix shape, and a step's
  shape follows its token count, so the cache gains entries with every new batch size until its
  default capacity of 1024. The server bounds it unless the environment already does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

ONEDNN_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
# Projection shapes are shared by every layer, so 64 primitives hold about a dozen batch sizes:
# the sizes a busy server repeats step after step.
SERVER_ONEDNN_CACHE = 64


def bound_onednn_cache() -> None:
    """Cap oneDNN's primitive cache; call before the first oneDNN operation (it reads this once)."""
    os.environ.setdefault(ONEDNN_CACHE_ENV, str(SERVER_ONEDNN_CACHE))


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
