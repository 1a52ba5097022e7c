"""Command-line options shared by every command that builds an engine (generate, serve, bench)."""

import argparse
from dataclasses import fields

from pagedllm.config import EngineConfig


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="HF directory or .gguf file (default: the built-in SmolLM2-135M-Instruct)")
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="weights and KV cache dtype")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--kv-cache-memory", default="2GiB", help="memory for the KV pool, e.g. 2GiB")
    g.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks (overrides --kv-cache-memory)")
    g.add_argument("--max-num-seqs", type=int, default=64, help="most sequences running in one step")
    g.add_argument("--max-num-batched-tokens", type=int, default=1024, help="token budget of one step")
    g.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output (default: the model's)")
    g.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reuse cached KV blocks of identical prompt prefixes",
    )
    g.add_argument("--preemption-mode", default="recompute", choices=["recompute", "swap"])
    g.add_argument(
        "--allocator", default="paged", choices=["paged", "contiguous"],
        help="contiguous: admit requests only with a max-length contiguous reservation (the baseline)",
    )
    g.add_argument("--attention-impl", default="auto", help="auto, reference or blockwise")
    g.add_argument("--served-model-name", default=None, help="model name reported by the API")
    g.add_argument("--max-n", type=int, default=16, help="largest n / beam width a request may ask for")
    g.add_argument("--seed", type=int, default=0, help="engine seed for requests without their own")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Every EngineConfig field comes from the option of the same name (e.g. --block-size -> block_size)."""
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})
