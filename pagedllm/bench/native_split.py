"""Where a run's time goes inside native code: `python -m pagedllm.bench.native_split [throughput options]`.

cProfile (`profile_step`) sees the decoder stack as one call, and most of a run is that call. This runs the
throughput workload once with Linux `perf` sampling the process (every thread) from just before the first
request to just after the last token, and splits the samples by the function each fell in: the projections'
matmul, the attention kernel, the fused ops between them, sampling, OpenMP's runtime (threads waiting at the end
of a parallel region), Python, the rest of torch, the C library and the OS kernel. With both threads busy, a
share of the samples is that share of the wall time. Needs `perf` on PATH and a `kernel.perf_event_paranoid`
that lets a process sample its own threads (2 or less). Not a test.
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

# (category, words of the function's name that put it there), tried in order, for pagedllm's compiled kernels
KERNEL_PARTS = [
    ("attention kernel", ("Kernel", "paged_attention", "merge_parts", "make_work", "WorkList", "Scratch")),
    ("KV write, block copies", ("write_kv", "copy_blocks", "swap_blocks")),
    ("norms, rotary, SiLU x up", ("rms_norm", "norm_row", "rotary", "silu")),
    ("sampling passes", ("greedy", "sampl", "row_max", "top_k", "top_p", "logprob")),
    ("weight packing (load time)", ("pack_",)),
    # the matmul's functions are templates over its element types F32, BF16 and BF16Widened
    ("matmuls", ("F32", "BF16", "linear", "amx", "panel", "multiply")),
]
# (category, words of the library's path or the function's name), for everything else
LIBRARY_PARTS = [
    ("matmuls", ("dnnl", "mkldnn", "gemm", "libmkl", "openblas")),
    ("OpenMP runtime (waits, fork/join)", ("libgomp", "libiomp", "libomp")),
    ("Python interpreter", ("libpython", "python3")),
    ("torch (other ops)", ("libtorch", "libc10")),
    ("C library (malloc, memcpy)", ("libc.so", "libm.so", "ld-linux", "libstdc++", "tcmalloc")),
    ("OS kernel (page faults, scheduling)", ("[kernel", "kallsyms")),
]
OTHER_KERNELS, OTHER = "other compiled kernels", "other"
# `perf script -F ip,sym,dso` lines: "    7f2cab59c77c PyDict_Copy (/usr/lib/libpython3.11.so.1.0)"
LINE = re.compile(r"^\s*[0-9a-f]+\s+(?P<sym>.*?)\s*\((?P<dso>[^()]*)\)\s*$")


def parse_line(line: str) -> tuple[str, str] | None:
    """(function, library path) of one `perf script -F ip,sym,dso` line; None for lines that are not samples."""
    match = LINE.match(line)
    return (match["sym"] or "[unknown]", match["dso"]) if match else None


def classify(sym: str, dso: str) -> str:
    """The category of a sample that fell in function `sym` of library `dso`."""
    if "pagedllm_cpu" in dso:
        for category, words in KERNEL_PARTS:
            if any(w in sym for w in words):
                return category
        return OTHER_KERNELS
    for category, words in LIBRARY_PARTS:
        if any(w in dso or w in sym for w in words):
            return category
    return OTHER


def split(samples: Iterable[tuple[str, str]]) -> tuple[Counter, Counter]:
    """Sample counts by category and by function."""
    categories, functions = Counter(), Counter()
    for sym, dso in samples:
        categories[classify(sym, dso)] += 1
        functions[sym] += 1
    return categories, functions


def perf_command() -> str:
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("native_split needs Linux perf on PATH (Debian: apt install linux-perf)")
    return perf


def start_sampling(perf: str, data: Path, frequency: int) -> subprocess.Popen:
    """`perf record` on this process; returns once it samples (or exits with perf's own message)."""
    proc = subprocess.Popen([perf, "record", "-q", "-F", str(frequency), "-p", str(os.getpid()), "-o", str(data)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 10
    while not data.exists() or data.stat().st_size == 0:
        if proc.poll() is not None:
            raise SystemExit(f"perf record could not sample this process: {proc.stderr.read().strip()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("perf record did not start within 10 s")
        time.sleep(0.05)
    time.sleep(0.2)  # its first ring buffers mapped: samples from here on are kept
    return proc


def stop_sampling(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise SystemExit("perf record did not stop within 60 s") from None


def read_samples(perf: str, data: Path) -> list[tuple[str, str]]:
    script = subprocess.run([perf, "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True, text=True)
    if script.returncode != 0:
        raise SystemExit(f"perf script could not read the samples: {script.stderr.strip()}")
    return [s for s in map(parse_line, script.stdout.splitlines()) if s is not None]


def print_split(categories: Counter, functions: Counter, elapsed: float, frequency: int, top: int) -> None:
    total = sum(categories.values())
    if total == 0:
        raise SystemExit("perf recorded no samples")
    print(f"{total} samples at {frequency} Hz ({total / frequency:.1f} CPU s) over {elapsed:.1f} s of run")
    for category, count in categories.most_common():
        print(f"  {category:<38} {100 * count / total:5.1f}%  {count / frequency:7.2f} CPU s")
    for sym, count in functions.most_common(top):
        print(f"  {100 * count / total:5.1f}%  {sym[:140]}")


def main(argv: list[str] | None = None) -> int:
    from pagedllm.bench.engine_runner import run_engine
    from pagedllm.bench.throughput import add_arguments, engine_config, load_engine, workload_for

    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.native_split")
    add_arguments(parser)
    parser.add_argument("--frequency", type=int, default=499, help="samples a second per thread")
    parser.add_argument("--top", type=int, default=15, help="also list the N functions with the most samples")
    args = parser.parse_args(argv)
    perf = perf_command()
    engine = load_engine(engine_config(args))
    workload = workload_for(engine, args)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        proc = start_sampling(perf, data, args.frequency)
        try:
            result = run_engine(engine, workload, "sampled", not args.no_progress, seeded=args.seed_samples)
        finally:
            stop_sampling(proc)
        categories, functions = split(read_samples(perf, data))
    print(f"{result.output_tokens_per_s:.1f} output tok/s over {result.steps} steps ({result.elapsed_s:.1f} s)")
    print_split(categories, functions, result.elapsed_s, args.frequency, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
