"""pagedllm's matmul against oneDNN's on the default model's projections, weights streamed from memory.

    python -m pagedllm.bench.linear_ab [--dtype float32] [--threads 2] [--layers 30] [--rows 1 8 32 64 1024]
    python -m pagedllm.bench.linear_ab --builds A.so B.so A.so B.so [--repeats 15] ...

Builds `--layers` layers of distinct random weights of the default model's projection shapes (fused
q/k/v, o, fused gate/up, down), packs each both ways (bfloat16 on a CPU with AMX: a third way, for
pagedllm's AMX matmul), and times one pass over all of them per batch of rows, the matmuls in turn: with
30 layers the weights (425 MB in float32) far exceed most caches, so every pass reads them from memory
as a decode step does. Prints the best GFLOP/s of each.
With --builds it times pagedllm's matmul in several builds of the kernels instead (`pagedllm_cpu_<key>.so`
files, as for kernel_ab), one pass of each in turn per repeat, and prints each build's median GFLOP/s;
with --amx as well, their AMX matmuls.
Needs the compiled kernels and a CPU the kernel covers (AVX-512 or AVX2; AVX512-BF16 for bfloat16). Not a
test.
"""

import argparse
import statistics
from types import ModuleType

import torch

from pagedllm.bench.attention_bench import time_interleaved
from pagedllm.bench.ceiling import LAYER_SHAPES, best_rate
from pagedllm.bench.kernel_ab import load_build
from pagedllm.model.projection import linear_kernels, packed_weight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.linear_ab", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 512, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--builds", nargs="+", metavar="SO", help="compare these builds' matmuls instead")
    parser.add_argument("--amx", action="store_true", help="with --builds: their AMX matmuls (bfloat16)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if args.builds:
        return compare_builds([load_build(path) for path in args.builds], args, dtype)
    kernels = linear_kernels(dtype)
    if kernels is None:
        raise SystemExit(f"no compiled linear kernel for {args.dtype} on this machine (see the kernels' log)")
    torch.set_num_threads(args.threads)
    weights = layer_weights(args.layers, dtype)
    onednn = [packed_weight(w) for w in weights]
    ours = [kernels.pack_linear(w) for w in weights]
    amx = [kernels.pack_amx_linear(w) for w in weights] if dtype == torch.bfloat16 and kernels.has_amx_tiles() else []
    print(f"{args.dtype}, {args.threads} threads, {args.layers} layers; best GFLOP/s of {args.repeats} passes")
    for rows in args.rows:
        inputs, flop = layer_inputs(rows, dtype), 2 * rows * sum(w.numel() for w in weights)

        def run_onednn() -> None:
            for w, p in zip(weights, onednn):
                torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], p, None, "none", [], "")

        def run_ours() -> None:
            for w, p in zip(weights, ours):
                kernels.linear(inputs[w.shape[1]], p, None, w.shape[0])

        def run_amx() -> None:
            for w, p in zip(weights, amx):
                kernels.amx_linear(inputs[w.shape[1]], p, None, w.shape[0])

        a, b = best_rate(run_onednn, flop, args.repeats), best_rate(run_ours, flop, args.repeats)
        line = f"rows {rows:5d}   oneDNN {a:6.0f}   pagedllm {b:6.0f}   x{b / a:.2f}"
        if amx:  # pagedllm's AMX matmul (bfloat16 on a CPU with AMX)
            c = best_rate(run_amx, flop, args.repeats)
            line += f"   pagedllm AMX {c:6.0f}   x{c / a:.2f}"
        print(line)
    return 0


def layer_weights(layers: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """Distinct random weights of the default model's projection shapes, `layers` layers of them."""
    return [(torch.randn(o, i) / i**0.5).to(dtype) for _ in range(layers) for o, i in LAYER_SHAPES]


def layer_inputs(rows: int, dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """A batch of `rows` inputs per input width of those projections."""
    return {i: torch.randn(rows, i).to(dtype) for _, i in LAYER_SHAPES}


def compare_builds(builds: list[ModuleType], args: argparse.Namespace, dtype: torch.dtype) -> int:
    """Median GFLOP/s of each build's matmul over the layers, the builds timed in turn within every repeat."""
    torch.set_num_threads(args.threads)
    weights = layer_weights(args.layers, dtype)
    if args.amx and dtype != torch.bfloat16:
        raise SystemExit("--amx compares bfloat16 matmuls: add --dtype bfloat16")
    pack = "pack_amx_linear" if args.amx else "pack_linear"
    packed = [[getattr(build, pack)(w) for w in weights] for build in builds]
    print(f"{args.dtype}, {args.threads} threads, {args.layers} layers; median GFLOP/s of {args.repeats} passes")
    for rows in args.rows:
        inputs, flop = layer_inputs(rows, dtype), 2 * rows * sum(w.numel() for w in weights)

        def run(build: ModuleType, panels: list[torch.Tensor]) -> None:
            matmul = build.amx_linear if args.amx else build.linear
            for w, p in zip(weights, panels):
                matmul(inputs[w.shape[1]], p, None, w.shape[0])

        passes = {str(i): (lambda b=b, p=p: run(b, p)) for i, (b, p) in enumerate(zip(builds, packed))}
        times = time_interleaved(passes, args.repeats)  # ms, after one warm-up pass of each
        rates = "  ".join(f"{flop / statistics.median(ms) / 1e6:6.1f}" for ms in times.values())
        print(f"rows {rows:5d}   {rates}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
