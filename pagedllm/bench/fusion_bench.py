"""The elementwise work between a layer's matmuls, three ways: torch eager, torch.compile (inductor) of the
same code, and the compiled kernels' fused ops (pagedllm/csrc/layer_ops.cpp).

    python -m pagedllm.bench.fusion_bench [--tokens 64 512] [--dtype float32] [--threads 1]

Per layer of the default model's shapes: residual add + RMSNorm twice, rotary on q and k, SiLU x up.
Prints microseconds per layer (minimum over repeats, thread CPU time). Not a test.
"""

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pagedllm.model.layers import RMSNorm, apply_rotary

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, EPS = 576, 9, 3, 64, 1536, 1e-5


def eager_layer(x, residual, qkv, gate_up, norm, cos, sin):
    """The reference layer's elementwise ops, as the torch path runs them."""
    residual = residual + x
    normed = norm(residual)
    q = qkv[:, : HEADS * HEAD_DIM].view(-1, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(-1, KV_HEADS, HEAD_DIM)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    normed2 = norm(residual + normed)
    gate, up = gate_up.chunk(2, dim=-1)
    return normed2, q, k, F.silu(gate) * up


def kernel_layer(kernels, x, residual, qkv, gate_up, norm, cos, sin):
    """The same work through the fused ops (in place where the compiled path is)."""
    w = norm.weight
    kernels.add_rms_norm(x, residual, w, EPS)
    q = qkv[:, : HEADS * HEAD_DIM].view(-1, HEADS, HEAD_DIM)
    k = qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM].view(-1, KV_HEADS, HEAD_DIM)
    kernels.rotary(q, cos, sin)
    kernels.rotary(k, cos, sin)
    kernels.add_rms_norm(x, residual, w, EPS)
    return kernels.silu_mul(gate_up)


def best_us(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.thread_time()
        fn()
        times.append(time.thread_time() - start)
    return min(times) * 1e6


def inputs(tokens: int, dtype: torch.dtype) -> tuple:
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, HIDDEN, generator=gen).to(dtype)
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    gate_up = torch.randn(tokens, 2 * INTERMEDIATE, generator=gen).to(dtype)
    angles = torch.rand(tokens, 1, HEAD_DIM, generator=gen)
    norm = RMSNorm(HIDDEN, EPS).to(dtype)
    return x, x.clone(), qkv, gate_up, norm, angles.cos().to(dtype), angles.sin().to(dtype)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from pagedllm.kernels import load_cpu_kernels

    kernels = load_cpu_kernels()
    compiled = torch.compile(eager_layer, dynamic=True)
    dtype = getattr(torch, args.dtype)
    print(f"dtype={args.dtype} threads={args.threads}: microseconds per layer (min of {args.repeats})")
    print(f"{'tokens':>7} {'eager':>9} {'torch.compile':>14} {'fused kernels':>14}")
    for tokens in args.tokens:
        data = inputs(tokens, dtype)
        with torch.inference_mode():
            eager = best_us(lambda: eager_layer(*data), args.repeats)
            inductor = best_us(lambda: compiled(*data), args.repeats)
            fused = best_us(lambda: kernel_layer(kernels, *data), args.repeats) if kernels else float("nan")
        print(f"{tokens:>7} {eager:>9.1f} {inductor:>14.1f} {fused:>14.1f}")


if __name__ == "__main__":
    main()
