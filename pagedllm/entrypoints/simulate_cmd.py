"""`pagedllm simulate`: replay a request trace through contiguous and paged allocators, side by side."""

import argparse
import json
import sys

DEFAULT_SYNTHETIC = 1000  # the same defaults as pagedllm.sim.trace.SyntheticConfig
DEFAULT_RATE = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group()
    src.add_argument("--trace", metavar="FILE.jsonl", help="JSONL request trace (see docs/simulate.md)")
    src.add_argument("--synthetic", type=int, metavar="N",
                     help=f"N synthetic ShareGPT-shaped requests (default when no --trace: {DEFAULT_SYNTHETIC})")
    parser.add_argument("--seed", type=int, default=0, help="synthetic trace seed (default 0)")
    parser.add_argument("--rate", type=float, default=DEFAULT_RATE,
                        help=f"synthetic Poisson arrival rate, requests per step (default {DEFAULT_RATE})")
    parser.add_argument("--pool-slots", type=int, default=32768, help="KV pool size in token slots (default 32768)")
    parser.add_argument("--block-sizes", default="1,4,16,64,256", help="paged block sizes (default 1,4,16,64,256)")
    parser.add_argument("--prefix-block-size", type=int, default=16,
                        help="block size of the prefix-sharing policy; 0 leaves it out (default 16)")
    parser.add_argument("--max-len", type=int, default=2048, help="model maximum length (default 2048)")
    parser.add_argument("--policies", help="comma-separated subset of policies to run (default: all)")
    parser.add_argument("--json", metavar="FILE", help="write the per-policy report as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot the policies side by side")
    parser.add_argument("--draw", type=int, metavar="STEP", help="draw the memory map at this step (needs --out)")
    parser.add_argument("--out", metavar="FILE.png", help="where --draw writes its picture")
    parser.add_argument("--draw-policy", metavar="NAME", help="policy to draw (default paged-16, or the first)")
    parser.add_argument("--save-trace", metavar="FILE.jsonl", help="also write the trace that was replayed")


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    from pagedllm.errors import InvalidInputError

    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InvalidInputError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values:
        raise InvalidInputError(f"{flag}: expected at least one integer, got {text!r}")
    return values


def _trace(args: argparse.Namespace):
    from pagedllm.errors import InvalidInputError
    from pagedllm.sim.trace import SyntheticConfig, load_trace, synthetic_trace

    if args.trace is not None:
        if not args.trace.strip():
            raise InvalidInputError("--trace needs a path, not an empty string")
        return load_trace(args.trace)
    n = DEFAULT_SYNTHETIC if args.synthetic is None else args.synthetic
    if n <= 0:
        raise InvalidInputError(f"--synthetic: number of requests must be positive, got {n}")
    return synthetic_trace(SyntheticConfig(num_requests=n, seed=args.seed, rate=args.rate, max_len=args.max_len))


def _config(args: argparse.Namespace):
    from pagedllm.sim.config import SimConfig

    prefix = args.prefix_block_size if args.prefix_block_size != 0 else None
    return SimConfig(args.pool_slots, args.max_len, _int_list(args.block_sizes, "--block-sizes"), prefix)


def _draw_args(args: argparse.Namespace, names: list[str]) -> tuple[int | None, str | None]:
    from pagedllm.errors import InvalidInputError

    if (args.draw is None) != (args.out is None):
        raise InvalidInputError("--draw STEP and --out FILE.png go together")
    if args.draw is None:
        return None, None
    if args.draw < 0:
        raise InvalidInputError(f"--draw: step must be >= 0, got {args.draw}")
    return args.draw, args.draw_policy or ("paged-16" if "paged-16" in names else names[0])


def format_table(result) -> str:
    head = (f"{'policy':<13} {'util% mean':>10} {'peak':>5} | {'waste% at peak: resv':>20} {'int':>5} {'ext':>5} "
            f"{'total':>5} | {'mean total':>10} | {'running peak':>12} {'mean':>6} | {'done':>5} {'steps':>6} "
            f"{'preempt':>7}")
    lines = [head, "-" * len(head)]
    for name, r in result.policies.items():
        s = r.summary()
        pk, mn = s["waste_at_peak_pct"], s["waste_mean_pct"]
        lines.append(
            f"{name:<13} {s['util_mean_pct']:>10.1f} {s['util_peak_pct']:>5.1f} | {pk['reservation']:>20.1f} "
            f"{pk['internal']:>5.1f} {pk['external']:>5.1f} {pk['total']:>5.1f} | {mn['total']:>10.1f} | "
            f"{s['peak_running']:>12} {s['mean_running']:>6.1f} | {s['finished']:>5} {s['steps']:>6} "
            f"{s['preemptions']:>7}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pagedllm.entrypoints.output_paths import check_output_paths
    from pagedllm.errors import InvalidInputError
    from pagedllm.sim.simulate import simulate
    from pagedllm.sim.trace import save_trace

    check_output_paths(args, ("json", "plot", "out", "save_trace"), pictures=("plot", "out"))
    trace = _trace(args)
    cfg = _config(args)
    names = cfg.policy_names() if args.policies is None else [p.strip() for p in args.policies.split(",") if p.strip()]
    if not names:
        raise InvalidInputError(f"--policies: name at least one of {', '.join(cfg.policy_names())}")
    unknown = [n for n in names if n not in cfg.policy_names()]
    if unknown:
        raise InvalidInputError(f"unknown policy {unknown[0]!r}; choose from {', '.join(cfg.policy_names())}")
    draw_step, draw_policy = _draw_args(args, names)
    if args.save_trace:
        try:
            save_trace(trace, args.save_trace)
        except OSError as exc:
            raise InvalidInputError(f"cannot write {exc.filename}: {exc.strerror}") from None
    with tqdm(total=len(trace) * len(names), desc="simulate", unit="req", file=sys.stderr,
              disable=None if len(trace) * len(names) >= 2000 else True) as bar:
        result = simulate(trace, cfg, names, draw_step, draw_policy, on_finish=bar.update)
    print(f"{len(trace)} requests, pool {cfg.pool_slots} slots, max-len {cfg.max_len}; "
          "util = slots holding tokens; waste = reserved-unused + internal + external, % of pool")
    print(format_table(result))
    _write_outputs(args, result)
    return 0


def _write_outputs(args: argparse.Namespace, result) -> None:
    from pagedllm.errors import InvalidInputError

    try:
        _write_files(args, result)
    except OSError as exc:
        raise InvalidInputError(f"cannot write {exc.filename}: {exc.strerror}") from None


def _write_files(args: argparse.Namespace, result) -> None:
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result.to_json(), f, indent=2)
    if args.plot or args.out:
        from pagedllm.sim.draw import draw_memory_map, plot_results

        if args.plot:
            plot_results(result, args.plot)
        if args.out and result.memory_map is not None:
            draw_memory_map(result.memory_map, args.out)
