"""Micro-benchmark of the paged attention implementations on SmolLM2-135M shapes.

    .venv/bin/python -m pagedllm.bench.attention_bench [--threads 2] [--reps 20] [--layouts]

Workloads: a decode batch (48 sequences, contexts 100-600), 32 decodes whose tables share their first 384
tokens' blocks (prefix caching), and prefill (3 prompts of 256-512 tokens, no cache; and one 256-token
chunk after 256 cached tokens). 9 query heads, 3 KV heads, head_dim 64, block
size 16, physical blocks shuffled in a pool of 2800 blocks. Reports the minimum and median of --reps
interleaved runs in ms (the minimum is the robust figure on a shared machine) and the ratio to reference.
"""

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

from pagedllm.attention import AttentionMetadata, allocate_kv_caches, paged_attention, write_kv

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, POOL_BLOCKS = 9, 3, 64, 16, 2800
IMPLS = ("reference", "blockwise", "fast", "compiled")


def make_workload(
    specs: list[tuple[int, int]],
    dtype: torch.dtype,
    seed: int = 0,
    shared_tokens: int = 0,
    block_size: int = BLOCK_SIZE,
    pool_blocks: int = POOL_BLOCKS,
    in_order: bool = False,
):
    """(query, kv_cache, meta) for sequences (num_cached, query_len) with shuffled physical blocks (in_order:
    each sequence's blocks one after another, from block 0); the blocks of the first `shared_tokens` positions
    are the first sequence's in every table."""
    gen = torch.Generator().manual_seed(seed)
    counts = [-(-(c + q) // block_size) for c, q in specs]
    order = list(range(pool_blocks)) if in_order else torch.randperm(pool_blocks, generator=gen).tolist()
    tables = [order[sum(counts[:i]) : sum(counts[: i + 1])] for i in range(len(counts))]
    shared = shared_tokens // block_size
    tables = [tables[0][:shared] + table[shared:] for table in tables]
    cache = allocate_kv_caches(1, pool_blocks, block_size, KV_HEADS, HEAD_DIM, dtype)[0]
    full = AttentionMetadata.build(tables, [0] * len(specs), [c + q for c, q in specs], block_size)
    tokens = full.slot_mapping.numel()
    write_kv(torch.randn(tokens, KV_HEADS, HEAD_DIM), torch.randn(tokens, KV_HEADS, HEAD_DIM), cache, full.slot_mapping)
    meta = AttentionMetadata.build(tables, [c for c, _ in specs], [q for _, q in specs], block_size)
    query = torch.randn(sum(q for _, q in specs), HEADS, HEAD_DIM, generator=gen).to(dtype)
    return query, cache, meta


class Workload(NamedTuple):
    specs: list[tuple[int, int]]  # per sequence (num_cached, query_len)
    shared_tokens: int = 0  # positions whose blocks every table shares

    def build(self, dtype: torch.dtype):
        return make_workload(self.specs, dtype, shared_tokens=self.shared_tokens)


def workloads() -> dict[str, Workload]:
    rng = random.Random(0)
    return {
        "decode 48 seqs, ctx 100-600": Workload([(rng.randint(99, 599), 1) for _ in range(48)]),
        "decode 32 seqs, shared 384-token prefix + 66": Workload([(384 + 66, 1)] * 32, shared_tokens=384),
        "prefill 3 prompts 256-512": Workload([(0, 512), (0, 256), (0, 384)]),
        "chunked prefill 256 after 256": Workload([(256, 256)]),
    }


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # warm-up
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def report(title: str, times: dict[str, list[float]], baseline: str) -> None:
    base = min(times[baseline])
    print(f"  {title}")
    for name, ts in times.items():
        print(f"    {name:<12} min {min(ts):8.2f} ms   median {statistics.median(ts):8.2f} ms   x{base / min(ts):6.2f}")


def bench_impls(dtype: torch.dtype, reps: int) -> None:
    for title, workload in workloads().items():
        query, cache, meta = workload.build(dtype)
        fns = {impl: (lambda impl=impl: paged_attention(query, cache, meta, HEAD_DIM**-0.5, impl)) for impl in IMPLS}
        report(title, time_interleaved(fns, reps), "reference")


def bench_layouts(dtype: torch.dtype, reps: int) -> None:
    """Decode read path (gather + attention) on [2, blocks, B, kvh, d] vs [2, kvh, blocks, B, d]."""
    # the cache in the current layout [2, kvh, blocks, B, d]
    query, cache, meta = workloads()["decode 48 seqs, ctx 100-600"].build(dtype)
    old = cache.permute(0, 2, 3, 1, 4).contiguous()  # [2, blocks, B, kvh, d]
    tables = meta.block_tables
    num_seqs, ctx = tables.shape[0], tables.shape[1] * BLOCK_SIZE
    pad = torch.arange(ctx).unsqueeze(0) >= meta.seq_lens.unsqueeze(1)  # [S, ctx]
    q = query.view(num_seqs, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)  # [S, kvh, g, d]

    def attend(k: torch.Tensor, v: torch.Tensor, q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        probs = (q @ k.transpose(-1, -2)).float().masked_fill_(mask, float("-inf")).softmax(-1)
        return probs.to(v.dtype) @ v

    def blocks_first() -> torch.Tensor:  # needs a transposing copy to get per-head contiguous keys
        kv = old.index_select(1, tables.flatten()).view(2, num_seqs, ctx, KV_HEADS, HEAD_DIM).transpose(2, 3)
        kv = kv.contiguous()  # [2, S, kvh, ctx, d]
        return attend(kv[0], kv[1], q, pad.view(num_seqs, 1, 1, ctx))

    def heads_first() -> torch.Tensor:  # the gather is already [kvh, S, ctx, d]
        kv = cache.index_select(2, tables.flatten()).view(2, KV_HEADS, num_seqs, ctx, HEAD_DIM)
        return attend(kv[0], kv[1], q.transpose(0, 1), pad.view(1, num_seqs, 1, ctx))

    fns = {"[2,N,B,h,d]": blocks_first, "[2,h,N,B,d]": heads_first}
    report("decode read path by layout, one padded batch (no chunking)", time_interleaved(fns, reps), "[2,N,B,h,d]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--layouts", action="store_true", help="also compare KV layouts on the decode read path")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {args.threads}, heads {HEADS}/{KV_HEADS}, d {HEAD_DIM}, B {BLOCK_SIZE}")
    for name in args.dtypes:
        dtype = getattr(torch, name)
        print(name)
        bench_impls(dtype, args.reps)
        if args.layouts:
            bench_layouts(dtype, args.reps)


if __name__ == "__main__":
    main()
