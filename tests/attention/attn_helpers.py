"""Random paged batches and an independent dense oracle for the attention tests."""

from dataclasses import dataclass

import torch

from pagedllm.attention import AttentionMetadata, allocate_kv_caches, write_kv


@dataclass
class Batch:
    query: torch.Tensor  # [num_tokens, heads, d]
    kv_cache: torch.Tensor
    meta: AttentionMetadata
    keys: list[torch.Tensor]  # per sequence [seq_len, kvh, d], contiguous, never read from the pool
    values: list[torch.Tensor]
    scale: float


def make_batch(
    specs: list[tuple[int, int]],  # per sequence (num_cached, query_len)
    num_heads: int,
    num_kv_heads: int,
    block_size: int,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in specs]
    counts = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(counts) + 3
    perm = torch.randperm(num_blocks, generator=gen).tolist()  # physical blocks in shuffled order
    tables, at = [], 0
    for n in counts:
        tables.append(perm[at : at + n])
        at += n
    cache = allocate_kv_caches(1, num_blocks, block_size, num_kv_heads, head_dim, dtype)[0]
    cache.normal_(generator=gen)  # garbage in unused slots must never leak into results
    keys = [torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype) for s in seq_lens]
    values = [torch.randn(s, num_kv_heads, head_dim, generator=gen).to(dtype) for s in seq_lens]
    full = AttentionMetadata.build(tables, [0] * len(specs), seq_lens, block_size)
    write_kv(torch.cat(keys), torch.cat(values), cache, full.slot_mapping)
    meta = AttentionMetadata.build(tables, [c for c, _ in specs], [q for _, q in specs], block_size)
    query = torch.randn(sum(q for _, q in specs), num_heads, head_dim, generator=gen).to(dtype)
    return Batch(query, cache, meta, keys, values, head_dim**-0.5)


def dense_attention(batch: Batch) -> torch.Tensor:
    """Causal softmax attention in float64 on the contiguous per-sequence K/V."""
    outs = []
    start = 0
    for k, v, q_len in zip(batch.keys, batch.values, batch.meta.query_lens_list):
        q = batch.query[start : start + q_len].double()  # [q, H, d]
        start += q_len
        group = q.shape[1] // k.shape[1]
        k = k.double().repeat_interleave(group, dim=1)  # [L, H, d]
        v = v.double().repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * batch.scale
        q_pos = torch.arange(k.shape[0] - q_len, k.shape[0]).unsqueeze(1)
        scores = scores.masked_fill(torch.arange(k.shape[0]) > q_pos, float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), v))
    return torch.cat(outs)
