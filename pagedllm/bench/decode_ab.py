"""Decode attention over many layers' caches, several kernel builds side by side.

    .venv/bin/python -m pagedllm.bench.decode_ab A.so B.so A.so B.so [--dtype bfloat16] [--layers 30]
        [--seqs 64] [--block-sizes 16 128] [--reps 10] [--threads 2]

A decode step reads every sequence's K/V once per layer, from caches far larger than the CPU's caches. This
builds one cache per layer (attention_bench's shapes: SmolLM2's 9 heads over 3, head_dim 64) holding
`--seqs` sequences of 100-600 cached tokens, with each sequence's blocks in shuffled order and in order, for
each block size, and times one decode (one new token per sequence) through all the layers with each build
in turn. Prints the median ms per pass and the K/V read rate for each build. The builds are
`pagedllm_cpu_<key>.so` files, as for kernel_ab; list them as A B A B and compare like positions.
"""

import argparse
import random
import statistics

import torch

from pagedllm.bench.attention_bench import HEAD_DIM, HEADS, KV_HEADS, make_workload, time_interleaved
from pagedllm.bench.kernel_ab import load_build


def make_layers(contexts: list[int], block_size: int, in_order: bool, layers: int, dtype: torch.dtype):
    """[(kv_cache, decode metadata)] per layer: every sequence's cached tokens written, blocks in order or not,
    in a pool of just the blocks they take."""
    specs = [(c, 1) for c in contexts]
    pool = sum(-(-(c + 1) // block_size) for c in contexts)
    return [
        make_workload(specs, dtype, seed=layer, block_size=block_size, pool_blocks=pool, in_order=in_order)[1:]
        for layer in range(layers)
    ]


def time_builds(builds: list, layers: list, query: torch.Tensor, reps: int) -> list[float]:
    """Median ms of one pass through every layer, per build (builds called in turn, after one warm-up pass each)."""
    out = torch.empty_like(query)

    def one_pass(build) -> None:
        for cache, meta in layers:
            build.paged_attention(out, query, cache, meta.block_tables, meta.seq_lens, meta.query_start_loc,
                                  HEAD_DIM**-0.5, 0)  # fmt: skip

    passes = {str(i): (lambda b=b: one_pass(b)) for i, b in enumerate(builds)}
    return [statistics.median(ms) for ms in time_interleaved(passes, reps).values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.decode_ab", description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="paths of pagedllm_cpu_<key>.so files")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    builds = [load_build(path) for path in args.builds]
    rng = random.Random(0)
    contexts = [rng.randint(100, 600) for _ in range(args.seqs)]
    kv_bytes = sum(contexts) * KV_HEADS * HEAD_DIM * 2 * dtype.itemsize * args.layers
    print(f"threads {args.threads}, {args.dtype}, {args.seqs} decodes over {args.layers} layers "
          f"({kv_bytes / 1e6:.0f} MB of K/V); median ms per pass, GB/s")  # fmt: skip
    query = torch.randn(args.seqs, HEADS, HEAD_DIM).to(dtype)
    for block_size in args.block_sizes:
        for in_order in (False, True):
            layers = make_layers(contexts, block_size, in_order, args.layers, dtype)
            medians = time_builds(builds, layers, query, args.reps)
            cells = "  ".join(f"{ms:7.2f} {kv_bytes / ms / 1e6:5.1f}" for ms in medians)
            print(f"  blocks of {block_size:3d}, {'in order' if in_order else 'shuffled'}  {cells}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
