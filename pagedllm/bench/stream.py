"""The machine's streaming ceilings: how fast memory is read by plain vector loads and by the AMX matmul's tile loads.

    python -m pagedllm.bench.stream [--threads 2] [--sizes 16 64 128 256 1024] [--reps 5]

A decode step reads every weight and every sequence's K/V once, so its floor is those bytes over the rate
printed here for sizes past the caches (`torch.sum` reads slower than memory on some CPUs, so a C loop,
stream_probe.c, does the reading). Small sizes show the caches' rate. On a CPU with AMX it also walks the
default model's 30 layers of projections the way pagedllm's AMX matmul reads them, with and without its
requests four tile steps ahead: the rate the weights of a decode step can stream at on the tiles. The probe is
compiled with the C compiler ($CC, else cc) once per machine and cached. Not a test.
"""

import argparse
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from pagedllm.cache_dir import cache_dir
from pagedllm.kernels.build import cpu_flags

SOURCE = Path(__file__).with_name("stream_probe.c")
AMX_FLAGS = ("amx_tile", "amx_bf16")


@dataclass(frozen=True)
class Rate:
    ms: float  # best pass
    mb: float  # MiB read per pass
    gb_per_s: float


def has_amx() -> bool:
    return all(flag in cpu_flags() for flag in AMX_FLAGS)


def build_probe() -> Path:
    """The compiled probe for this CPU (built on first use); RuntimeError without a C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise RuntimeError("no C compiler found ($CC or cc): the stream probe is compiled on this machine")
    flags = ["-O2", "-march=native", "-fopenmp"] + (["-mamx-tile", "-mamx-bf16"] if has_amx() else [])
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([version, *flags, *sorted(cpu_flags())]).encode()).hexdigest()
    binary = cache_dir() / "probes" / f"stream_probe_{key[:16]}"
    if not binary.exists():
        binary.parent.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".tmp")
        result = subprocess.run([cc, *flags, str(SOURCE), "-o", str(partial)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the stream probe failed:\n{result.stderr.strip()}")
        partial.rename(binary)
    return binary


def run_probe(binary: Path, *args: object) -> Rate:
    """One probe run: `read MB THREADS REPS` or `tiles PREFETCH THREADS REPS`."""
    result = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"stream probe {' '.join(map(str, args))} failed: {result.stderr.strip()}")
    ms, mb, rate = (float(x) for x in result.stdout.split())
    return Rate(ms, mb, rate)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 128, 256, 1024], help="MiB read per pass")
    parser.add_argument("--reps", type=int, default=5, help="passes after a warm-up; the best is printed")
    args = parser.parse_args(argv)
    if min(args.threads, args.reps, *args.sizes) < 1:
        parser.error("--threads, --reps and --sizes must be positive")
    binary = build_probe()
    print(f"{args.threads} threads, best of {args.reps} passes")
    for mb in args.sizes:
        rate = run_probe(binary, "read", mb, args.threads, args.reps)
        print(f"read {mb:5d} MiB again and again: {rate.gb_per_s:6.1f} GB/s ({rate.ms:.2f} ms)")
    if not has_amx():
        return
    for prefetch, how in ((1, "requested 4 steps ahead, as the matmul"), (0, "not requested ahead")):
        try:
            rate = run_probe(binary, "tiles", prefetch, args.threads, args.reps)
        except RuntimeError as exc:  # the OS may not grant the tiles
            print(exc)
            return
        print(f"AMX tile loads over {rate.mb:.1f} MiB of weights, {how}: {rate.gb_per_s:6.1f} GB/s ({rate.ms:.2f} ms)")


if __name__ == "__main__":
    main()
