"""Micro-benchmark of the model through ModelRunner: prefill tokens/s and decode step time.

    python -m pagedllm.model.speed [--model PATH] [--dtype float32|bfloat16] [--threads N]

Not a test (nothing is asserted); the project's own benchmark lives in pagedllm.bench.
"""

import argparse
import time

import torch

from pagedllm.engine.model_runner import ModelRunner, SeqInput
from pagedllm.kv.block_table import blocks_needed


def _blocks(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def time_prefill(runner: ModelRunner, num_seqs: int, prompt_len: int, repeats: int) -> float:
    """Tokens per second for `num_seqs` prompts of `prompt_len` tokens in one step."""
    per_seq = blocks_needed(prompt_len, runner.block_size)
    seqs = [SeqInput([(7 * i + j) % 1000 + 10 for j in range(prompt_len)], 0, _blocks(i * per_seq, per_seq))
            for i in range(num_seqs)]  # fmt: skip
    runner.execute(seqs)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        runner.execute(seqs)
    return num_seqs * prompt_len * repeats / (time.perf_counter() - start)


def time_decode(runner: ModelRunner, num_seqs: int, context: int, steps: int) -> float:
    """Seconds per decode step of `num_seqs` sequences, each with `context` tokens cached."""
    per_seq = blocks_needed(context + steps + 1, runner.block_size)
    tables = [_blocks(i * per_seq, per_seq) for i in range(num_seqs)]
    runner.execute([SeqInput([11] * context, 0, t, needs_logits=False) for t in tables])
    start = time.perf_counter()
    for step in range(steps):
        runner.execute([SeqInput([42], context + step, t) for t in tables])
    return (time.perf_counter() - start) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file or HF directory (default: the built-in model)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--attention-impl", default="auto")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from pagedllm.model.default_model import require_default_model
    from pagedllm.model.loader import load_model

    dtype = getattr(torch, args.dtype)
    model, config = load_model(args.model or require_default_model(), dtype)
    runner = ModelRunner(model, config, num_blocks=1024, block_size=16, dtype=dtype, attention_impl=args.attention_impl)
    print(f"dtype={args.dtype} threads={args.threads} attention={args.attention_impl}")
    print(f"prefill 1 x 512 tokens:   {time_prefill(runner, 1, 512, 3):8.0f} tokens/s")
    print(f"prefill 4 x 128 tokens:   {time_prefill(runner, 4, 128, 3):8.0f} tokens/s")
    for n in (1, 16):
        print(f"decode {n:2d} seqs @ ctx 256: {1000 * time_decode(runner, n, 256, 20):8.1f} ms/step")


if __name__ == "__main__":
    main()
