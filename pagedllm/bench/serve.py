"""`pagedllm bench serve`: load an OpenAI-compatible server with a workload and report its latencies.

With --base-url it drives any server (pagedllm's, vLLM's `vllm serve`, ...). Without, it starts
`pagedllm serve` on 127.0.0.1 for the run (engine options via --dtype / --serve-args) and stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from pagedllm.bench.workloads import add_sample_seeds_option
from pagedllm.errors import InvalidInputError

DEFAULT_VOCAB_SIZE = 49152  # the default model's (SmolLM2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    s = parser.add_argument_group("server")
    s.add_argument("--base-url", default=None,
                   help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000 (default: start `pagedllm serve`)")
    s.add_argument("--model", default=None,
                   help="model name to request (default: the server's first); when pagedllm is started, "
                        "the model it serves (HF directory or .gguf)")
    s.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="for the started server (default: %(default)s, as the side-by-side figures use)")
    s.add_argument("--serve-args", default="", help="more options for the started `pagedllm serve`, one string")
    s.add_argument("--label", default=None, help="engine name in the report (default: the model card's owned_by)")
    w = parser.add_argument_group("workload")
    w.add_argument("--workload", default="mixed", help="mixed, sharegpt-like, shared-prefix, parallel-sampling, "
                                                       "or a .jsonl file")
    w.add_argument("--num-requests", type=int, default=None, help="default: the workload's")
    w.add_argument("--seed", type=int, default=0, help="seeds the prompts, the arrival times and sampling")
    w.add_argument("--vocab-size", type=int, default=None,
                   help=f"token ids are drawn below this (default: the model's config.json, else {DEFAULT_VOCAB_SIZE})")
    w.add_argument("--prefix-len", type=int, default=384, help="shared-prefix: tokens in the common prefix")
    load = parser.add_argument_group("load")
    load.add_argument("--request-rate", type=float, default=math.inf,
                      help="requests per second, Poisson arrivals (default inf: all at once)")
    load.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    load.add_argument("--timeout", type=float, default=1800.0, help="seconds the whole run may take")
    load.add_argument("--ready-timeout", type=float, default=600.0,
                      help="seconds to wait for the server's /health (and a started server's startup)")
    add_sample_seeds_option(load)
    load.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                      help="let requests stop at EOS (default: every request runs to max_tokens)")
    out = parser.add_argument_group("output")
    out.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                     help="write the report as JSON (to stdout without PATH)")
    out.add_argument("--md", nargs="?", const="-", default=None, metavar="PATH",
                     help="write the report as a Markdown table (to stdout without PATH)")
    out.add_argument("--plot", default=None, metavar="PATH", help="PNG of the latency percentiles")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    from pagedllm.bench.serve_report import render_markdown, render_text, write_output

    report = asyncio.run(_run_with_server(args)) if args.base_url else _run_launched(args)
    if "-" not in (args.json, args.md):  # the table, unless a report goes to stdout in its place
        print(render_text(report))
    if args.json is not None:
        write_output(args.json, json.dumps(report, indent=2) + "\n")
    if args.md is not None:
        write_output(args.md, render_markdown(report))
    if args.plot is not None:
        from pagedllm.bench.plots import plot_latency_percentiles

        plot_latency_percentiles([report], args.plot)
    return 0 if report["metrics"]["failed"] == 0 else 1


def _check_args(args: argparse.Namespace) -> None:
    if args.request_rate <= 0:
        raise InvalidInputError("--request-rate must be positive (inf: all at once)")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise InvalidInputError("--max-concurrency must be >= 1")
    if args.timeout <= 0 or args.ready_timeout <= 0:
        raise InvalidInputError("--timeout and --ready-timeout must be positive")
    if args.vocab_size is not None and args.vocab_size < 2:
        raise InvalidInputError(f"--vocab-size must be >= 2, got {args.vocab_size}")
    if args.num_requests is not None and args.num_requests < 1:
        raise InvalidInputError(f"--num-requests must be positive, got {args.num_requests}")


def _run_launched(args: argparse.Namespace) -> dict[str, Any]:
    from pagedllm.bench.serve_launch import launch

    serve_args = ["--dtype", args.dtype, *shlex.split(args.serve_args)]
    print(f"starting pagedllm serve {' '.join(serve_args)} ...", file=sys.stderr)
    server = launch(args.model, serve_args, args.ready_timeout)
    try:
        args.base_url, model_path = server.base_url, args.model
        args.model = None  # request whatever name the started server serves
        report = asyncio.run(_run_with_server(args, model_path))
        report["server"]["launched"] = " ".join(server.process.args)
        return report
    finally:
        server.stop()


async def _run_with_server(args: argparse.Namespace, model_path: str | None = None) -> dict[str, Any]:
    from pagedllm.bench.serve_client import ClientOptions, model_card, run_requests, wait_ready

    await wait_ready(args.base_url, timeout_s=args.ready_timeout)
    card = await model_card(args.base_url, args.model)
    workload, vocab_size = _workload(args, card, model_path)
    opts = ClientOptions(args.base_url, card["id"], args.request_rate, args.max_concurrency, args.seed,
                         args.ignore_eos, args.seed_samples, args.timeout)
    started = time.time()
    records, duration = await run_requests(workload.requests, opts)
    return _report(args, card, workload, vocab_size, started, records, duration)


def _workload(args: argparse.Namespace, card: dict[str, Any], model_path: str | None) -> tuple[Any, int]:
    from pagedllm.bench.workloads import WorkloadSpec, build_workload

    vocab_size = _vocab_size(args, model_path or card.get("root"))
    spec = WorkloadSpec(args.workload, args.num_requests, args.seed, vocab_size,
                        int(card.get("max_model_len") or 2048), args.prefix_len)
    workload = build_workload(spec)
    if any(r.beam for r in workload.requests):
        raise InvalidInputError("beam search is not part of the completions API; use `pagedllm bench throughput`")
    return workload, vocab_size


def _report(args: argparse.Namespace, card: dict[str, Any], workload: Any, vocab_size: int, started: float,
            records: list[Any], duration: float) -> dict[str, Any]:
    from pagedllm.bench.env_info import environment
    from pagedllm.bench.serve_metrics import compute_metrics

    return {
        "benchmark": "serve",
        "command": _command_line(),
        "engine": args.label or card.get("owned_by") or "unknown",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "server": {"base_url": args.base_url, "model": card["id"], "model_root": card.get("root"),
                   "max_model_len": card.get("max_model_len"), "launched": None},
        "workload": {"name": workload.name, "seed": workload.seed, "vocab_size": vocab_size,
                     **workload.length_stats()},
        "load": {"request_rate": _finite_or_str(args.request_rate), "max_concurrency": args.max_concurrency,
                 "ignore_eos": args.ignore_eos, "sample_seeds": args.seed_samples, "timeout_s": args.timeout},
        "metrics": _json_safe(compute_metrics(records, duration).to_dict()),
        "environment": environment(),  # the client's side of the machine (threads are the client's)
    }


def _command_line() -> str | None:
    """The command that produced the report (None when called from Python, e.g. tests)."""
    if Path(sys.argv[0]).name not in ("pagedllm", "__main__.py", "cli.py", "serve.py"):
        return None
    prefix = ["pagedllm"] if Path(sys.argv[0]).name != "serve.py" else ["python", "-m", "pagedllm.bench.serve"]
    return " ".join(shlex.quote(a) for a in [*prefix, *sys.argv[1:]])


def _vocab_size(args: argparse.Namespace, model: str | None) -> int:
    if args.vocab_size is not None:
        return args.vocab_size
    config = Path(model) / "config.json" if model else None
    if config is not None and config.is_file():
        return int(json.loads(config.read_text())["vocab_size"])
    return DEFAULT_VOCAB_SIZE


def _finite_or_str(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _json_safe(value: Any) -> Any:
    """NaN (an empty summary) becomes null so the JSON stays standard."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    """`python -m pagedllm.bench.serve ...`, the same as `pagedllm bench serve ...`."""
    from pagedllm.errors import UserFacingError

    parser = argparse.ArgumentParser(prog="pagedllm bench serve", description=__doc__.splitlines()[0])
    add_arguments(parser)
    try:
        return run(parser.parse_args(argv))
    except UserFacingError as exc:
        print(f"pagedllm bench serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
