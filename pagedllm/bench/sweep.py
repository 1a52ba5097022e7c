"""`pagedllm bench sweep`: one engine run per value of block size or max_num_seqs, on the same requests;
throughput and KV waste (empty tail slots / used slots, sampled after every step) per point."""

import argparse
import gc
import sys

from pagedllm.bench.throughput import add_output_arguments
from pagedllm.bench.workloads import WORKLOADS
from pagedllm.entrypoints.engine_args import add_engine_arguments

PARAMETERS = {"block-size": "block_size", "max-num-seqs": "max_num_seqs",
              "max-num-batched-tokens": "max_num_batched_tokens"}  # fmt: skip
DEFAULT_VALUES = {"block-size": "1,2,4,8,16,32,64,128,256", "max-num-seqs": "1,2,4,8,16,32,64",
                  "max-num-batched-tokens": "256,512,1024,2048,4096"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    s = parser.add_argument_group("sweep")
    s.add_argument("--parameter", choices=sorted(PARAMETERS), default="block-size", help="what to vary")
    s.add_argument("--values", default=None, help="comma-separated values (default: block size 1..256 in "
                   "powers of two; max_num_seqs 1..64)")  # fmt: skip
    s.add_argument("--workload", default="mixed", help=f"{', '.join(WORKLOADS)} or a JSONL file")
    s.add_argument("--num-requests", type=int, default=32, help="requests per point")
    s.add_argument("--prefix-len", type=int, default=384, help="shared prefix length (shared-prefix workload)")
    add_output_arguments(parser)
    add_engine_arguments(parser)


def parse_values(text: str) -> list[int]:
    from pagedllm.errors import InvalidInputError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InvalidInputError(f"--values must be comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise InvalidInputError(f"--values must be positive integers, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    from pagedllm.bench import plots, report
    from pagedllm.bench.throughput import write_outputs

    result = run_sweep(args)
    print(report.format_table(result))
    write_outputs(result, args)
    if args.plot:
        plots.plot_sweep(result, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def run_sweep(args: argparse.Namespace) -> dict:
    from pagedllm.bench.engine_runner import run_engine
    from pagedllm.bench.throughput import build_report, engine_config, load_engine, workload_for

    field = PARAMETERS[args.parameter]
    values = parse_values(DEFAULT_VALUES[args.parameter] if args.values is None else args.values)
    runs, workload, model_name = [], None, None
    for value in values:
        gc.collect()
        engine = load_engine(engine_config(args, **{field: value}))
        workload = workload or workload_for(engine, args)  # the same requests at every point
        model_name = engine.model_name
        runs.append(run_engine(engine, workload, f"{field}={value}", not args.no_progress))
        del engine
    result = build_report("sweep", model_name, engine_config(args), workload, runs, {})
    result["parameter"] = field
    result["points"] = [_point(value, run) for value, run in zip(values, result["runs"])]
    return result


def _point(value: int, run: dict) -> dict:
    keys = ("output_tokens_per_s", "total_tokens_per_s", "requests_per_s", "mean_kv_waste", "peak_blocks_used",
            "num_blocks", "num_preemptions", "elapsed_s", "cpu_s")  # fmt: skip
    return {"value": value, **{k: run[k] for k in keys}}
