"""Keep the host allocator from handing a step's freed buffers back to the OS.

Every forward pass allocates its activations anew (a prompt step's matmul outputs are 5-25 MB each). glibc's
malloc serves such sizes with fresh mmaps, or from the heap top that it trims back to the OS after they are
freed, so the next step touches new pages again: a float32 mixed run took about 760,000 page faults (3 GB
zeroed by the kernel) in 22 s, and the kernels writing those pages ran slower for it. With the mmap threshold
fixed at its largest (32 MiB) and trimming only past 2 GiB of free heap, the pages of freed buffers stay in the
heap for the next step, as with the caching allocators other engines preload (tcmalloc, jemalloc). The heap
keeps the high-water mark of a step's buffers; anything larger than 32 MiB still goes back to the OS when freed.
"""

import ctypes
import ctypes.util
import logging
import resource

logger = logging.getLogger("pagedllm")

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 << 20  # glibc's upper limit on 64-bit hosts
_TRIM_THRESHOLD = 2**31 - 1  # the largest mallopt takes (an int): trim only past 2 GiB of free heap top


def keep_freed_memory() -> bool:
    """Set glibc's malloc to reuse freed step buffers; False where the C library has no mallopt (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    applied = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1 and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD) == 1
    if not applied:
        logger.debug("mallopt refused the step-buffer settings; the allocator keeps its defaults")
    return applied


def minor_page_faults() -> int:
    """The process's minor page faults so far: each a page the kernel mapped (and zeroed) on first touch."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def available_bytes() -> int | None:
    """The memory the kernel says new allocations can take without swapping (MemAvailable); None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
