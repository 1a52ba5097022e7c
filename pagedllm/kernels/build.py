"""Build the compiled CPU kernels (pagedllm/csrc) once per machine, then load them.

The build targets the CPU it runs on (-march=native: AVX2, AVX-512, AVX512-BF16, whatever it reports), so
the cache key covers the CPU's flags as well as the sources, torch and the compiler: a build from another
CPU kind is never loaded. It covers where torch is installed too: two environments on one machine (a
checkout's and a fresh clone's) each keep their own build instead of rebuilding over each other's, since
torch's extension loader rebuilds whenever the include paths it compiled with change. Where no compiler is
found, or the build fails, `load_cpu_kernels()` logs one line and returns None, and the engine keeps its
torch path.

PAGEDLLM_DISABLE_KERNELS=1 (or true, yes, on) keeps the torch path. PAGEDLLM_KERNELS_ISA=avx2 builds for AVX2
alone (-march=haswell) and hides the CPU's newer vector flags from every choice made by them (kernels, dtype
"auto", tests): the AVX2 path tested on a CPU that has more (`make test-avx2`).
"""

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from pagedllm.cache_dir import cache_dir
from pagedllm.errors import InvalidInputError

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent.parent / "csrc"
SOURCES = ("bindings.cpp", "paged_attention.cpp", "attention_work.cpp", "cache_ops.cpp", "layer_ops.cpp",
           "linear.cpp", "amx_linear.cpp", "amx_blocks.cpp", "amx_tiles.cpp", "sampling_ops.cpp", "decoder_stack.cpp")
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-DNDEBUG")
DISABLE_ENV = "PAGEDLLM_DISABLE_KERNELS"
ISA_ENV = "PAGEDLLM_KERNELS_ISA"
NEWER_THAN_AVX2 = ("avx512", "amx")  # flag prefixes an AVX2 build hides


ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")  # what picks the kernels' and dtype's paths


def cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of /proc/cpuinfo, or None where there is none."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(field):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def avx2_only() -> bool:
    """Whether $PAGEDLLM_KERNELS_ISA asks for the AVX2 build on this CPU ("avx2"; unset or empty: the CPU's own)."""
    isa = os.environ.get(ISA_ENV, "")
    if isa not in ("", "avx2"):
        raise InvalidInputError(f"{ISA_ENV} is 'avx2' or unset, not {isa!r}")
    return isa == "avx2"


def cpu_flags() -> list[str]:
    """The CPU's flags (empty where /proc/cpuinfo has none), without those newer than AVX2 under avx2_only()."""
    flags = (cpuinfo("flags") or "").split()
    return [f for f in flags if not f.startswith(NEWER_THAN_AVX2)] if avx2_only() else flags


def cflags() -> tuple[str, ...]:
    """The compiler flags: CFLAGS, for Haswell's instruction set (AVX2, FMA) under avx2_only()."""
    return tuple("-march=haswell" if f == "-march=native" and avx2_only() else f for f in CFLAGS)


def cpu_isa() -> list[str]:
    """The vector-instruction flags among ISA_FLAGS that this CPU reports."""
    present = set(cpu_flags())
    return [flag for flag in ISA_FLAGS if flag in present]


def compiler() -> str | None:
    """The C++ compiler torch's extension builder will call ($CXX, else c++), if it exists."""
    name = os.environ.get("CXX", "c++")
    return shutil.which(name)


def build_key(cxx: str) -> str:
    import torch

    digest = hashlib.sha256()
    for path in sorted(CSRC.iterdir()):
        if path.suffix in (".cpp", ".h"):
            digest.update(path.name.encode() + path.read_bytes())
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    torch_dir = str(Path(torch.__file__).parent)
    for part in (torch.__version__, torch_dir, version, " ".join(cflags()), " ".join(sorted(cpu_flags()))):
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def kernels_disabled() -> bool:
    """Whether $PAGEDLLM_DISABLE_KERNELS asks for the torch path (1, true, yes, on; 0, false, no, off or unset:
    not)."""
    value = os.environ.get(DISABLE_ENV, "").strip().lower()
    if value not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
        raise InvalidInputError(f"{DISABLE_ENV} is 1/true/yes/on or 0/false/no/off, not {value!r}")
    return value in ("1", "true", "yes", "on")


def build_cpu_kernels() -> ModuleType | None:
    """Build (or reuse the cached build) and import the kernels; None with one logged line if impossible.
    InvalidInputError for a value of the environment switches it does not know."""
    avx2_only()  # a misspelt ISA is the user's to fix, not a failed build
    if kernels_disabled():
        log.info("compiled CPU kernels disabled by %s; using the torch path", DISABLE_ENV)
        return None
    cxx = compiler()
    if cxx is None:
        log.warning("no C++ compiler found (%s); using the torch path", os.environ.get("CXX", "c++"))
        return None
    try:
        return _load(build_key(cxx))
    except Exception as exc:  # a failed build must never stop the engine
        log.warning("building the compiled CPU kernels failed (%s); using the torch path", _first_error(exc))
        return None


def _first_error(exc: Exception) -> str:
    """The compiler's first error line, else the exception's first line."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return next((line.strip() for line in lines if "error:" in line), lines[0])


def _load(key: str) -> ModuleType:
    from torch.utils import cpp_extension

    bin_dir = str(Path(sys.executable).parent)  # where pip puts the `ninja` the build runs
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    build_dir = cache_dir() / "kernels" / key
    sources = _copy_sources(build_dir / "src")
    library = build_dir / f"pagedllm_cpu_{key}.so"
    log.debug("loading compiled CPU kernels from %s", build_dir)
    with _held_by_this_process(build_dir / ".flock"):
        # torch's own lock file: a build killed before it finished leaves it behind, and every later load would
        # wait for it forever; while this process holds the lock above, no other load is under way, so a file
        # left here is such a leftover
        (build_dir / "lock").unlink(missing_ok=True)
        if library.exists() and not _whole_elf(library):
            # ninja judges it by its time alone and would load it: a cut-short file crashes the process (SIGBUS)
            log.warning("the cached kernels %s are damaged; linking them again", library)
            library.unlink()
        if not library.exists():
            log.info("building the compiled CPU kernels for this CPU in %s (minutes, once)", build_dir)
        return cpp_extension.load(
            name=f"pagedllm_cpu_{key}",
            sources=[str(sources / name) for name in SOURCES],
            extra_cflags=list(cflags()),
            extra_ldflags=["-fopenmp"],
            build_directory=str(build_dir),
            verbose=False,
        )


def _whole_elf(path: Path) -> bool:
    """Whether the file is a 64-bit little-endian ELF as long as its header says (the section headers end it)."""
    with open(path, "rb") as f:
        header = f.read(64)
    if len(header) < 64 or header[:6] != b"\x7fELF\x02\x01":
        return False
    section_headers_at, = struct.unpack_from("<Q", header, 0x28)
    entry_size, count = struct.unpack_from("<HH", header, 0x3A)
    return path.stat().st_size >= section_headers_at + entry_size * count


@contextlib.contextmanager
def _held_by_this_process(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (waiting for it), which the OS releases when its holder exits or dies."""
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process's build of the compiled CPU kernels (%s)", path.parent)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copy_sources(dest: Path) -> Path:
    """The build compiles a private copy of the sources: the build records their paths, so compiling another
    checkout's files in place would make every checkout rebuild the others' build."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in CSRC.iterdir():
        if path.suffix in (".cpp", ".h") and not (dest / path.name).exists():
            tmp = dest / f".{path.name}.{os.getpid()}"
            shutil.copyfile(path, tmp)
            os.replace(tmp, dest / path.name)  # atomic: a concurrent build never sees half a file
    return dest


@functools.cache
def load_cpu_kernels() -> ModuleType | None:
    """The kernels module, built at most once per process (and once per machine, thanks to the cache)."""
    return build_cpu_kernels()
