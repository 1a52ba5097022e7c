"""pagedllm's matmul against oneDNN's on the default model's projections, weights streamed from memory.

    python -m pagedllm.bench.linear_ab [--dtype float32] [--threads 2] [--layers 30] [--rows 1 8 32 64 1024]

Builds `--layers` layers of distinct random weights of the default model's projection shapes (fused
q/k/v, o, fused gate/up, down), packs each both ways, and times one pass over all of them per batch of
rows, the two matmuls in alternation: with 30 layers the weights (425 MB in float32) far exceed the
caches, so every pass reads them from memory as a decode step does. Prints the best GFLOP/s of each.
Needs the compiled kernels and a CPU the kernel covers (AVX-512 or AVX2; AVX512-BF16 for bfloat16). Not a
test.
"""

import argparse

import torch

from pagedllm.bench.ceiling import LAYER_SHAPES, best_rate
from pagedllm.model.projection import linear_kernels, packed_weight


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.linear_ab", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 128, 512, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    kernels = linear_kernels(dtype)
    if kernels is None:
        raise SystemExit(f"no compiled linear kernel for {args.dtype} on this machine (see the kernels' log)")
    torch.set_num_threads(args.threads)
    weights = [(torch.randn(o, i) / i**0.5).to(dtype) for _ in range(args.layers) for o, i in LAYER_SHAPES]
    onednn = [packed_weight(w) for w in weights]
    ours = [kernels.pack_linear(w) for w in weights]
    print(f"{args.dtype}, {args.threads} threads, {args.layers} layers; best GFLOP/s of {args.repeats} passes")
    for rows in args.rows:
        inputs = {i: torch.randn(rows, i).to(dtype) for _, i in LAYER_SHAPES}
        flop = 2 * rows * sum(w.numel() for w in weights)

        def run_onednn() -> None:
            for w, p in zip(weights, onednn):
                torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], p, None, "none", [], "")

        def run_ours() -> None:
            for w, p in zip(weights, ours):
                kernels.linear(inputs[w.shape[1]], p, None, w.shape[0])

        a, b = best_rate(run_onednn, flop, args.repeats), best_rate(run_ours, flop, args.repeats)
        print(f"rows {rows:5d}   oneDNN {a:6.0f}   pagedllm {b:6.0f}   x{b / a:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
