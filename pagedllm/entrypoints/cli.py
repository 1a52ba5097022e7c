"""The `pagedllm` command: one subcommand per module, imported only when used."""

import argparse
import importlib
import sys

# subcommand -> module defining `add_arguments(parser)` and `run(args) -> int`.
# Modules keep heavy imports (torch, transformers) inside `run` so --help stays fast.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("pagedllm.entrypoints.simulate_cmd", "replay a request trace through paged and contiguous allocators"),
    "generate": ("pagedllm.entrypoints.generate_cmd", "generate text from a prompt with a model"),
    "serve": ("pagedllm.entrypoints.serve_cmd", "run the OpenAI-compatible server"),
    "bench": ("pagedllm.bench.cli", "benchmarks: throughput, serving latency, sweeps"),
    "convert": ("pagedllm.entrypoints.convert_cmd", "convert a model file, e.g. GGUF to a Hugging Face directory"),
    "fetch-default-model": ("pagedllm.entrypoints.fetch_cmd", "download and cache the built-in default model"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedllm", description="PagedAttention inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # subcommand not built yet
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub_parser)
        sub_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (UserFacingError, OSError) as exc:  # bad input, or a file that cannot be read or written
        print(f"pagedllm {args.command}: error: {exc}", file=sys.stderr)
        return 2


from pagedllm.errors import UserFacingError  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
