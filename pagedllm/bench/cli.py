"""`pagedllm bench <throughput | sweep | serve | soak>`: one subcommand per benchmark module.

Each module defines `add_arguments(parser)` and `run(args) -> int` and keeps torch imports inside `run`.
`serve` lives in pagedllm/bench/serve.py and is registered only when that module exists.
"""

import argparse
import importlib

from pagedllm.entrypoints.output_paths import check_output_paths

BENCHMARKS: dict[str, tuple[str, str]] = {
    "throughput": ("pagedllm.bench.throughput", "offline throughput: all requests at once, optional baselines"),
    "sweep": ("pagedllm.bench.sweep", "sweep block size, max_num_seqs or max_num_batched_tokens: throughput and KV waste per point"),
    "serve": ("pagedllm.bench.serve", "online serving latency against a running server"),
    "soak": ("pagedllm.bench.soak", "bursts of streams, hang-ups and bad requests: leaks and memory growth"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for name, (module_name, help_text) in BENCHMARKS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # not written yet
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(bench_parser)
        bench_parser.set_defaults(_bench_module=module)


def run(args: argparse.Namespace) -> int:
    check_output_paths(args, ("json", "md", "plot"), pictures=("plot",))
    return int(args._bench_module.run(args) or 0)
