"""A/B of compiled-kernel builds: several builds of pagedllm/csrc loaded side by side, timed interleaved.

    .venv/bin/python -m pagedllm.bench.kernel_ab BUILD.so BUILD.so ... [--threads 2] [--dtype float32]
        [--reps 30] [--warm]

Each build is a `pagedllm_cpu_<key>.so` from ~/.cache/pagedllm/kernels/<key>/ (build one per source
version with `python -m pagedllm.kernels`). Every rep calls each build once on the attention_bench
workloads, in the order given; by default a 64 MB write runs before every call, so that the K/V come
from memory as they do between the model's matmuls (--warm leaves the caches as they are). Prints the
minimum and median ms per build. The position in the order matters by a few percent: list the builds
as A B A B and compare like positions.
"""

import argparse
import importlib.util
import statistics
import time
from pathlib import Path
from types import ModuleType

import torch

from pagedllm.bench.attention_bench import HEAD_DIM, workloads


def load_build(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(Path(path).name.split(".")[0], path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"not a loadable extension: {path}")
    try:  # an extension module is loaded (dlopen) when it is created
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except ImportError as exc:  # missing file, not a shared object, or built for another torch
        raise SystemExit(f"not a loadable extension: {path} ({exc})") from None
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="paths of pagedllm_cpu_<key>.so files")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warm", action="store_true", help="no cache-evicting write between calls")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    builds = [load_build(path) for path in args.builds]
    evict = torch.zeros(16 * 1024 * 1024)
    print(f"threads {args.threads}, {args.dtype}, {'warm' if args.warm else 'cold'}; min / median ms per build")
    for title, workload in workloads().items():
        query, cache, meta = workload.build(getattr(torch, args.dtype))
        out = torch.empty_like(query)
        times: list[list[float]] = [[] for _ in builds]
        for rep in range(args.reps + 1):  # the first rep warms up
            for build, runs in zip(builds, times):
                if not args.warm:
                    evict.add_(1.0)
                start = time.perf_counter()
                build.paged_attention(out, query, cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                      HEAD_DIM**-0.5, 0)
                if rep > 0:
                    runs.append((time.perf_counter() - start) * 1e3)
        cells = "  ".join(f"{min(t):7.3f} / {statistics.median(t):7.3f}" for t in times)
        print(f"  {title:<44} {cells}")


if __name__ == "__main__":
    main()
