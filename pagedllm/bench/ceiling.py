"""The machine's matmul ceiling for the default model: what no engine on this CPU can beat.

    python -m pagedllm.bench.ceiling [--dtype float32] [--threads 2] [--tokens 64 512 1024]

Times one decoder layer's projections (fused q/k/v, o, fused gate/up, down: packed as the engine runs
them, for pagedllm's matmul where the CPU has AVX-512 or AVX2, else for oneDNN) and the LM head at a batch of T
tokens, and prints GFLOP/s. A workload's matmul work is 2 x 106.2 M FLOP per token the model processes
plus 2 x 28.3 M per sampled token (the LM head), so its fastest possible time is that work over the
measured rate. Not a test.
"""

import argparse
import time
from collections.abc import Callable

import torch

from pagedllm.model.projection import Projection, can_pack

HIDDEN, Q_OUT, KV_OUT, INTERMEDIATE, VOCAB, LAYERS = 576, 576, 192, 1536, 49152, 30
LAYER_SHAPES = [(Q_OUT + 2 * KV_OUT, HIDDEN), (HIDDEN, Q_OUT), (2 * INTERMEDIATE, HIDDEN), (HIDDEN, INTERMEDIATE)]
FLOP_PER_TOKEN = 2 * LAYERS * sum(o * i for o, i in LAYER_SHAPES)  # ~0.2123 GFLOP
FLOP_PER_SAMPLED_TOKEN = 2 * VOCAB * HIDDEN  # ~0.0566 GFLOP


def best_rate(run: Callable[[], object], flop: int, repeats: int) -> float:
    """GFLOP/s of `run` doing `flop`, best wall time of `repeats` passes after one that warms up (oneDNN's
    primitive cache, first touches)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return flop / best / 1e9


def rate(shapes: list[tuple[int, int]], tokens: int, dtype: torch.dtype, repeats: int) -> float:
    """GFLOP/s of running every (out, in) projection once over `tokens` rows, best of `repeats`."""
    projections = [Projection(torch.randn(o, i).to(dtype), None, can_pack(dtype)) for o, i in shapes]
    inputs = [torch.randn(tokens, i).to(dtype) for _, i in shapes]

    def run() -> None:
        for projection, x in zip(projections, inputs):
            projection(x)

    return best_rate(run, 2 * tokens * sum(o * i for o, i in shapes), repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 512, 1024])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"dtype={args.dtype} threads={args.threads}; per token {FLOP_PER_TOKEN / 1e9:.4f} GFLOP, "
          f"per sampled token +{FLOP_PER_SAMPLED_TOKEN / 1e9:.4f} GFLOP")  # fmt: skip
    with torch.inference_mode():
        for tokens in args.tokens:
            layer = rate(LAYER_SHAPES, tokens, dtype, args.repeats)
            head = rate([(VOCAB, HIDDEN)], min(tokens, 64), dtype, args.repeats)
            print(f"T={tokens:5d}: layer projections {layer:7.1f} GFLOP/s, LM head (<=64 rows) {head:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
