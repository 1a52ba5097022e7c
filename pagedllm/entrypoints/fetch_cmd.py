"""`pagedllm fetch-default-model`: download and cache the built-in default model."""

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "The file is cached under $PAGEDLLM_CACHE_DIR (default ~/.cache/pagedllm)."


def run(args: argparse.Namespace) -> int:
    from pagedllm.model.default_model import fetch_default_model

    print(fetch_default_model())
    return 0
