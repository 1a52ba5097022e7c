"""A/B of compiled-kernel builds on one real decode step: the decoder stack of each build, timed interleaved.

    .venv/bin/python -m pagedllm.bench.stack_ab A.so B.so A.so B.so [--at 30] [--reps 40] [--blocks on|off|both]
        [throughput options: --workload shared-prefix --dtype bfloat16 ...]

Runs the workload once with the engine as it is and keeps the inputs of the decoder stack's `--at`-th call that
runs every layer (a decode step's: steps with prompt rows run all but the last), with the KV caches as that
step left them. Then, for each build (a `pagedllm_cpu_<key>.so`, as for kernel_ab), packs the model's
projections and builds its decoder stack with that build, and times the step's layers with every build in turn.
Unlike kernel_ab and linear_ab, the step is the whole of a model's layers on real K/V: matmuls, attention and
the ops between them, with the weights streamed from memory between the attention calls as in a run. The builds
must take the same Python calls as this checkout's (a build from before a change to a kernel's signature cannot
be loaded here). List them as A B A B and compare like positions: separate processes on a shared machine
differed by more than the changes measured this way (docs/benchmarks.md). A model loaded from a GGUF file packs
its weights' stored Q4_1 / Q8_0 blocks too (as the engine does); `--blocks off` leaves them out, `--blocks
both` times each build with and without them.
"""

import argparse
import statistics
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from unittest import mock

import torch

from pagedllm.bench.attention_bench import time_interleaved
from pagedllm.bench.engine_runner import run_engine
from pagedllm.bench.kernel_ab import load_build
from pagedllm.bench.throughput import add_arguments, engine_config, load_engine, workload_for
from pagedllm.model import decoder_stack, projection
from pagedllm.model.default_model import default_model_path
from pagedllm.model.gguf_loader import read_gguf_with_blocks
from pagedllm.model.stored_blocks import EMPTY_BLOCKS, StoredBlocks


def capture_step(engine, workload, at: int) -> tuple:
    """(hidden, residual, cos_sin, kv_caches, meta) of the stack's `at`-th call in a run of the workload."""
    captured, real_call = {}, decoder_stack.DecoderStack.__call__

    def spy(stack, hidden, residual, cos_sin, kv_caches, meta, num_layers=None):
        if num_layers is None:  # every layer: a decode step (steps with prompt rows run all but the last)
            spy.calls += 1
            if spy.calls == at:
                captured["step"] = (hidden.clone(), residual.clone(), cos_sin, kv_caches, meta)
        return real_call(stack, hidden, residual, cos_sin, kv_caches, meta, num_layers)

    spy.calls = 0
    with mock.patch.object(decoder_stack.DecoderStack, "__call__", spy):
        run_engine(engine, workload, "capture", progress=False)
    if "step" not in captured:
        raise SystemExit(f"the run called the decoder stack {spy.calls} times, not {at}: lower --at")
    return captured["step"]


def stored_blocks_of(engine) -> Mapping[str, StoredBlocks]:
    """The stored blocks the engine's weights were loaded from (a GGUF file), none for other models."""
    path = Path(engine.config.model or default_model_path())
    return read_gguf_with_blocks(path)[2] if path.is_file() else EMPTY_BLOCKS


def stack_of(model, build: ModuleType, blocks: Mapping[str, StoredBlocks]) -> decoder_stack.DecoderStack:
    """The model's projections packed (with the stored blocks given, which small batches then stream), and its
    decoder stack built, with `build` instead of this checkout's."""
    with mock.patch.object(projection, "load_cpu_kernels", lambda: build), \
         mock.patch.object(decoder_stack, "load_cpu_kernels", lambda: build):  # fmt: skip
        model.fuse_projections(blocks)
    if model.stack is None:
        raise SystemExit("this model and dtype run no decoder stack here (it needs the compiled kernels)")
    return model.stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.stack_ab", description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="paths of pagedllm_cpu_<key>.so files")
    parser.add_argument("--at", type=int, default=30, help="which call of the decoder stack to replay")
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--blocks", choices=("on", "off", "both"), default="on",
                        help="pack the weights' stored blocks too (a GGUF model), or not, or each build both ways")
    add_arguments(parser)
    args = parser.parse_args(argv)
    engine = load_engine(engine_config(args))
    hidden, residual, cos_sin, kv_caches, meta = capture_step(engine, workload_for(engine, args), args.at)
    stored = stored_blocks_of(engine) if args.blocks != "off" else EMPTY_BLOCKS
    ways = {"on": [("", stored)], "off": [("", EMPTY_BLOCKS)], "both": [(" blocks", stored), (" panels", EMPTY_BLOCKS)]}
    stacks = {f"{i} {path.rsplit('/', 1)[-1]}{label}": stack_of(engine.model, load_build(path), blocks)
              for i, path in enumerate(args.builds) for label, blocks in ways[args.blocks]}  # fmt: skip

    def replay(stack: decoder_stack.DecoderStack) -> torch.Tensor:
        return stack(hidden.clone(), residual.clone(), cos_sin, kv_caches, meta)

    print(f"{hidden.dtype}, {torch.get_num_threads()} threads, decoder stack call {args.at}: {hidden.shape[0]} "
          f"tokens over {len(kv_caches)} layers; median and min ms of {args.reps} calls each")  # fmt: skip
    times = time_interleaved({name: (lambda s=s: replay(s)) for name, s in stacks.items()}, args.reps)
    for name, ms in times.items():
        print(f"  {name}  {statistics.median(ms):7.2f}  {min(ms):7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
