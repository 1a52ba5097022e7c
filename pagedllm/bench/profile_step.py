"""Where an engine step's time goes: `python -m pagedllm.bench.profile_step [throughput options]`.

Runs the throughput workload once under cProfile and splits the time into matmuls (F.linear), attention,
KV writes, sampling/postprocessing, scheduling, input preparation and the Python left around them. Batches
that the decoder stack runs (pagedllm/model/decoder_stack.py: every layer of a decode step, all but the last
of a step with prompt tokens) spend their layers' matmuls, attention and fused ops inside one call, reported
on its own line.
"""

import argparse
import cProfile
import pstats
import sys

# (label, file fragment, function name); cumulative time of each
PARTS = [
    ("engine step (total)", "llm_engine.py", "step"),
    ("  schedule", "scheduler.py", "schedule"),
    ("  prepare step tensors", "model_runner.py", "prepare"),
    ("  model forward", "llama.py", "forward"),
    ("    attention (paged_attention)", "attention/__init__.py", "paged_attention"),
    ("    attention (compiled path)", "model/compiled_ops.py", "attention"),
    ("    KV write (write_kv)", "kv_cache.py", "write_kv"),
    ("  logits (lm_head)", "llama.py", "compute_logits"),
    ("  sample + stops (output stage)", "output_stage.py", "process"),
    ("  detokenize", "text_stage.py", "detokenize"),
]
BUILTINS = [
    ("matmuls (torch linear)", "linear"),
    ("sdpa", "scaled_dot_product_attention"),
    ("compiled attention kernel", "paged_attention"),
    ("compiled KV write", "write_kv"),
    ("fused residual+RMSNorm", "add_rms_norm"),
    ("fused rotary", "rotary"),
    ("fused SiLU x up", "silu_mul"),
]
# the decoder stack's call into the kernels (a pybind11 method, which cProfile does not record): its wrapper
STACK = ("decoder stack (whole layers)", "decoder_stack.py", "__call__")


def main(argv: list[str] | None = None) -> int:
    from pagedllm.bench.engine_runner import run_engine
    from pagedllm.bench.throughput import add_arguments, engine_config, load_engine, workload_for

    parser = argparse.ArgumentParser(prog="python -m pagedllm.bench.profile_step")
    add_arguments(parser)
    parser.add_argument("--top", type=int, default=0, help="also list the N functions with the most self time")
    args = parser.parse_args(argv)
    engine = load_engine(engine_config(args))
    workload = workload_for(engine, args)
    profiler = cProfile.Profile()
    result = profiler.runcall(run_engine, engine, workload, "profiled", not args.no_progress)
    print(f"{result.output_tokens_per_s:.1f} output tok/s over {result.steps} steps ({result.elapsed_s:.1f} s)")
    stats = pstats.Stats(profiler)
    print_split(stats, result.elapsed_s)
    if args.top:
        stats.sort_stats("tottime").print_stats(args.top)
    return 0


def print_split(stats: pstats.Stats, elapsed: float) -> None:
    table = stats.stats  # {(file, line, func): (cc, nc, tottime, cumtime, callers)}
    for label, fragment, func in PARTS:
        # max: several functions share a name (every module has a forward); the outermost holds the rest
        cum = max((v[3] for (f, _, name), v in table.items() if name == func and f.endswith(fragment)), default=0.0)
        print(f"{label:<36} {cum:8.2f} s  {100 * cum / elapsed:5.1f}%")
    for label, fragment in BUILTINS:
        tot = sum(v[2] for (f, _, name), v in table.items() if f == "~" and fragment in name)
        print(f"{label:<36} {tot:8.2f} s  {100 * tot / elapsed:5.1f}%  (self time)")
    label, fragment, func = STACK
    stack = sum(v[3] for (f, _, name), v in table.items() if name == func and f.endswith(fragment))
    print(f"{label:<36} {stack:8.2f} s  {100 * stack / elapsed:5.1f}%")
    torch_self = stack + sum(v[2] for (f, _, name), v in table.items() if f == "~" and _native(name))
    print(f"{'all native calls (torch, kernels)':<36} {torch_self:8.2f} s  {100 * torch_self / elapsed:5.1f}%")
    print(f"{'Python and everything else':<36} {elapsed - torch_self:8.2f} s  {100 * (elapsed - torch_self) / elapsed:5.1f}%")


def _native(name: str) -> bool:
    """A call into compiled code: a torch built-in, torch.ops, or pagedllm's compiled kernels."""
    return "torch" in name.lower() or "PyCapsule" in name or "pagedllm_cpu" in name


if __name__ == "__main__":
    sys.exit(main())
