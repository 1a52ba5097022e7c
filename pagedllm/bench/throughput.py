"""`pagedllm bench throughput`: offline, every request submitted at once; optional side-by-side runs
(transformers static batches, prefix caching off, the contiguous allocator) on the same requests."""

import argparse
import dataclasses
import gc
import statistics
import sys
from typing import TYPE_CHECKING

from pagedllm.bench.workloads import (WORKLOADS, Workload, WorkloadSpec, add_sample_seeds_option, build_workload,
                                     check_fits)
from pagedllm.entrypoints.engine_args import add_engine_arguments, engine_config_from_args
from pagedllm.errors import InvalidInputError

if TYPE_CHECKING:
    from pagedllm.bench.engine_runner import RunResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    w = parser.add_argument_group("workload")
    w.add_argument("--workload", default="mixed", help=f"{', '.join(WORKLOADS)}, or a JSONL file of requests "
                   '({"prompt": text or token ids, "max_tokens": 64, "n": 1, "beam": false} per line)')  # fmt: skip
    w.add_argument("--num-requests", type=int, default=None, help="requests (default: 64 mixed/sharegpt-like, "
                   "32 shared-prefix, 8 parallel-sampling/beam)")  # fmt: skip
    w.add_argument("--prefix-len", type=int, default=384, help="shared prefix length (shared-prefix workload)")
    add_sample_seeds_option(w)
    c = parser.add_argument_group("comparisons")
    c.add_argument("--baseline", choices=["none", "hf"], default="none", help="also run transformers generate")
    c.add_argument("--hf-batch-size", type=int, default=16, help="prompts per static transformers batch")
    c.add_argument("--compare-prefix-caching", action="store_true", help="also run with prefix caching off")
    c.add_argument("--compare-allocators", action="store_true", help="also run the contiguous allocator")
    c.add_argument("--repeats", type=int, default=1, help="run every configuration this many times, in turn, "
                   "each on a fresh engine; the table shows each one's median run, the ratios are the medians "
                   "of the repeats' own ratios")  # fmt: skip
    add_output_arguments(parser)
    add_engine_arguments(parser)


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    o = parser.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", default=None, help="write the full result as JSON")
    o.add_argument("--md", metavar="PATH", default=None, help="write the result as Markdown")
    o.add_argument("--plot", metavar="PATH", default=None, help="write a PNG plot")
    o.add_argument("--no-progress", action="store_true", help="no progress bars")


def engine_config(args: argparse.Namespace, **changes):
    """The command line's EngineConfig, with some fields replaced (the comparison and sweep runs)."""
    return dataclasses.replace(engine_config_from_args(args), **changes)


def run(args: argparse.Namespace) -> int:
    from pagedllm.bench import plots, report

    if args.hf_batch_size < 1:
        raise InvalidInputError(f"--hf-batch-size must be >= 1, got {args.hf_batch_size}")
    if args.repeats < 1:
        raise InvalidInputError(f"--repeats must be >= 1, got {args.repeats}")
    result = run_throughput(args)
    print(report.format_table(result))
    write_outputs(result, args)
    if args.plot:
        plots.plot_kv_timeline(result, args.plot)
    return 0


def write_outputs(result: dict, args: argparse.Namespace) -> None:
    from pagedllm.bench import report

    if args.json:
        report.write_json(result, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.md:
        report.write_markdown(result, args.md)
        print(f"wrote {args.md}", file=sys.stderr)


@dataclasses.dataclass(slots=True)
class _Round:
    """One pass over every configuration: the main run first, then each comparison, named as its ratio."""

    model_name: str
    workload: Workload
    runs: list["RunResult"]  # the main run first
    names: list[str]  # the ratio name of each run after the main one


def run_throughput(args: argparse.Namespace) -> dict:
    from pagedllm.bench.report import concurrency_ratio, ratio

    config = engine_config(args)
    rounds = [_run_round(args, config, None)]
    for _ in range(1, args.repeats):
        rounds.append(_run_round(args, config, rounds[0].workload))
    first = rounds[0]
    runs = [_median_run([r.runs[i] for r in rounds]) for i in range(len(first.runs))]
    each = {name: [ratio(r.runs[0], r.runs[i + 1]) for r in rounds] for i, name in enumerate(first.names)}
    ratios = {name: statistics.median(values) for name, values in each.items()}
    report = build_report("throughput", first.model_name, config, first.workload, runs, ratios)
    variants = {name for name, _ in _variants(args, config)}  # engines of their own: how many sequences fit
    report["concurrency_ratios"] = {name: concurrency_ratio(runs[0], runs[i + 1]) for i, name in enumerate(first.names)
                                    if name in variants}  # fmt: skip
    if len(rounds) > 1:
        report["repeats"] = len(rounds)
        report["repeat_ratios"] = each
    return report


def _run_round(args: argparse.Namespace, config, workload: Workload | None) -> _Round:
    """Every configuration once, each on an engine of its own (freed before the next is loaded)."""
    from pagedllm.bench.engine_runner import run_engine

    progress = not args.no_progress
    engine = load_engine(config)
    workload = workload if workload is not None else workload_for(engine, args)
    runs = [run_engine(engine, workload, _label(config), progress, args.seed_samples)]
    names = []
    if args.baseline == "hf":
        runs.append(_hf_run(engine, workload, args, progress))
        names.append("pagedllm / transformers")
    model_name = engine.model_name
    del engine
    for name, changes in _variants(args, config):
        gc.collect()
        variant = engine_config(args, **changes)
        runs.append(run_engine(load_engine(variant), workload, _label(variant), progress, args.seed_samples))
        names.append(name)
    return _Round(model_name, workload, runs, names)


def _median_run(runs: list["RunResult"]) -> "RunResult":
    """The run of median output rate (of an even count, the slower of the middle two)."""
    return sorted(runs, key=lambda r: r.output_tokens_per_s)[(len(runs) - 1) // 2]


def _variants(args: argparse.Namespace, config) -> list[tuple[str, dict]]:
    out = []
    if args.compare_prefix_caching:
        flipped = not config.enable_prefix_caching
        name = "prefix caching on / off" if config.enable_prefix_caching else "prefix caching off / on"
        out.append((name, {"enable_prefix_caching": flipped}))
    if args.compare_allocators:
        current = getattr(config, "allocator", "paged")
        other = "contiguous" if current == "paged" else "paged"
        out.append((f"{current} / {other}", {"allocator": other}))
    return out


def _label(config) -> str:
    allocator = getattr(config, "allocator", "paged")
    prefix = "on" if config.enable_prefix_caching else "off"
    return f"pagedllm ({allocator}, prefix cache {prefix})"


def _hf_run(engine, workload: Workload, args: argparse.Namespace, progress: bool):
    from pagedllm.bench.hf_baseline import hf_model_from, run_hf

    hf_model = hf_model_from(engine.model, engine.model_config)
    pad = engine.tokenizer.pad_token_id if engine.tokenizer.pad_token_id is not None else 0
    try:
        return run_hf(hf_model, workload, args.hf_batch_size, pad, progress)
    finally:
        del hf_model


def load_engine(config):
    import logging

    from pagedllm.bench.engine_runner import warm_up
    from pagedllm.engine.llm_engine import LLMEngine

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    engine = LLMEngine(config)
    warm_up(engine)
    return engine


def workload_for(engine, args: argparse.Namespace) -> Workload:
    """Build the workload against the loaded model (vocab, length); text prompts become token ids once."""
    spec = WorkloadSpec(args.workload, args.num_requests, args.seed, engine.model_config.vocab_size,
                        engine.max_model_len, args.prefix_len)  # fmt: skip
    workload = build_workload(spec)
    for r in workload.requests:
        if isinstance(r.prompt, str):
            r.prompt = list(engine.tokenizer(r.prompt).input_ids)
            check_fits(r, engine.max_model_len)
    return workload


def build_report(benchmark: str, model_name: str, config, workload: Workload, runs: list, ratios: dict) -> dict:
    from pagedllm.bench.engine_runner import config_summary
    from pagedllm.bench.env_info import environment
    from pagedllm.bench.report import run_to_dict

    return {
        "benchmark": benchmark,
        "command": command_line(),
        "model": model_name,
        "environment": environment(),
        "workload": {"name": workload.name, "seed": workload.seed, **workload.length_stats()},
        "engine_config": config_summary(config),
        "runs": [run_to_dict(r) for r in runs],
        "ratios": ratios,
    }


def command_line() -> str | None:
    """The `pagedllm ...` command that produced this result (None when called from Python, e.g. tests)."""
    import shlex
    from pathlib import Path

    if Path(sys.argv[0]).name not in ("pagedllm", "__main__.py", "cli.py"):
        return None
    return "pagedllm " + " ".join(shlex.quote(a) for a in sys.argv[1:])
