"""Attention kernel builds compared on the calls of a real engine run.

    python -m pagedllm.bench.attention_replay A.so B.so [--workload mixed] [--dtype float32] [engine options]

Runs the workload through the engine; every compiled attention call is made with each build twice, in the
order A B B A, rotated by one build per call (B A A B next, ...): a call finds the caches warmed by the
calls before it, so each build takes each place equally often. The engine goes on with the last result. The
model's decoder stack is left out, so that every layer's attention is called from Python (the stack calls it
from C++). Prints, for decode-only calls and for calls of steps with prompt tokens, the number of calls and
each build's mean total seconds. The builds are `pagedllm_cpu_<key>.so` files, as for kernel_ab.
Not a test: the run takes about four times its attention time longer than a plain one.
"""

import argparse
import time
from collections import Counter, defaultdict
from types import ModuleType

import pagedllm.attention.compiled as compiled
from pagedllm.bench.kernel_ab import load_build


class ReplayingKernels:
    """The loaded kernels module, with paged_attention replaced by timed calls to each build."""

    def __init__(self, kernels: ModuleType, builds: list[ModuleType]) -> None:
        self.kernels, self.builds = kernels, builds
        self.seconds: defaultdict[tuple[str, int], float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str):
        return getattr(self.kernels, name)

    def paged_attention(self, out, query, kv_cache, block_tables, seq_lens, query_start_loc, scale, partition):
        kind = "decode" if query.shape[0] == seq_lens.shape[0] else "with prompt tokens"
        shift = sum(self.calls.values()) % len(self.builds)
        order = list(range(shift, len(self.builds))) + list(range(shift))
        for i in order + order[::-1]:
            start = time.perf_counter()
            self.builds[i].paged_attention(out, query, kv_cache, block_tables, seq_lens, query_start_loc, scale,
                                           partition)  # fmt: skip
            self.seconds[(kind, i)] += (time.perf_counter() - start) / 2
        self.calls[kind] += 1

    def report(self, names: list[str]) -> list[str]:
        lines = []
        for kind in sorted(self.calls):
            cells = "  ".join(f"{name} {self.seconds[(kind, i)]:7.2f} s" for i, name in enumerate(names))
            lines.append(f"{kind:<20} {self.calls[kind]:6d} calls   {cells}")
        return lines


def main(argv: list[str] | None = None) -> int:
    from pagedllm.bench.engine_runner import run_engine
    from pagedllm.bench.throughput import add_arguments, engine_config, load_engine, workload_for

    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.attention_replay",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="paths of pagedllm_cpu_<key>.so files")
    add_arguments(parser)
    args = parser.parse_args(argv)
    replaying = ReplayingKernels(compiled.kernels(), [load_build(path) for path in args.builds])
    original = compiled.kernels
    compiled.kernels = lambda: replaying
    try:
        engine = load_engine(engine_config(args))
        engine.model.stack = None  # the same kernels layer by layer, each call seen here
        run_engine(engine, workload_for(engine, args), "replay", not args.no_progress, args.seed_samples)
    finally:
        compiled.kernels = original
    names = [chr(ord("A") + i) for i in range(len(args.builds))]
    for name, path in zip(names, args.builds):
        print(f"{name}: {path}")
    print("\n".join(replaying.report(names)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
