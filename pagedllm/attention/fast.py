"""The fast CPU path ("auto"): batched padded matmuls for decode, SDPA per prompt for prefill.

- Decode sequences (one new token): sorted by context length and cut into chunks of bounded size; per
  chunk, one gather of the blocks, padded to the chunk's longest context, and two batched matmuls over
  (KV head, sequence) with a group's query heads as rows (GQA without copying K/V); softmax in float32
  with positions >= seq_len masked.
- Prefill sequences: gather the sequence's blocks, then torch SDPA (enable_gqa) with is_causal when there
  is no cached prefix, or an explicit causal mask offset by the cached length (chunked prefill).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedllm.attention.groups import make_group, split_decode_prefill
from pagedllm.attention.kv_cache import gather_blocks
from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.attention.reference import causal_mask


GATHER_BUDGET_BYTES = 8 << 20


@dataclass(slots=True)
class DecodeChunk:
    """Index tensors of one chunk of decode sequences: the same in every layer of a step."""

    rows: torch.Tensor  # [S] int64: each sequence's query row
    blocks: torch.Tensor  # [S * num_blocks] int64: the chunk's block tables, flattened
    pad: torch.Tensor  # [1, S, 1, ctx] bool: key positions at or past each sequence's length


@dataclass(slots=True)
class FastPlan:
    decode: list[DecodeChunk]
    prefill: list[tuple[slice, torch.Tensor, int]]  # (query rows, block table, seq_len)


def fast_attention(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
    if not isinstance(meta.plan, FastPlan):
        meta.plan = make_plan(meta, kv_cache)
    out = torch.empty_like(query)
    for chunk in meta.plan.decode:
        decode_attention(query, kv_cache, scale, chunk, out)
    for rows, table, seq_len in meta.plan.prefill:
        out[rows] = prefill_attention(query[rows], kv_cache, table, seq_len, scale)
    return out


def make_plan(meta: AttentionMetadata, kv_cache: torch.Tensor) -> FastPlan:
    """Group the step's sequences once; every layer then reuses the index tensors."""
    decode, prefill = split_decode_prefill(meta)
    block_size = kv_cache.shape[3]
    chunks = []
    for seq_ids in decode_chunks(meta, decode, kv_cache):
        group = make_group(meta, seq_ids)
        ctx = group.block_tables.shape[1] * block_size
        pad = torch.arange(ctx).unsqueeze(0) >= group.seq_lens.unsqueeze(1)  # [S, ctx]
        chunks.append(DecodeChunk(group.token_index[:, 0], group.block_tables.flatten(), pad.view(1, len(seq_ids), 1, ctx)))
    starts = meta.query_start_loc.tolist()
    prefill_work = [
        (slice(starts[i], starts[i] + meta.query_lens_list[i]), meta.block_tables[i], meta.seq_lens_list[i])
        for i in prefill
    ]
    return FastPlan(chunks, prefill_work)


def decode_chunks(meta: AttentionMetadata, seq_ids: list[int], kv_cache: torch.Tensor) -> list[list[int]]:
    """Decode sequences sorted by length, cut into chunks whose gathered K/V fit GATHER_BUDGET_BYTES.

    Sorting keeps the padding to each chunk's longest context small. The budget keeps every temporary
    in cache and well under glibc's 32 MiB mmap threshold: a larger gather is page-faulted afresh on
    every call, which measured ~6x slower than the copy itself.
    """
    if not seq_ids:
        return []
    ordered = sorted(seq_ids, key=lambda i: meta.seq_lens_list[i])
    _, kvh, _, block_size, head_dim = kv_cache.shape
    per_token = 2 * kvh * head_dim * kv_cache.element_size()
    chunks: list[list[int]] = [[]]
    for i in ordered:  # lengths only grow along `ordered`, so i's length pads the whole chunk
        padded = -(-meta.seq_lens_list[i] // block_size) * block_size
        if chunks[-1] and (len(chunks[-1]) + 1) * padded * per_token > GATHER_BUDGET_BYTES:
            chunks.append([])
        chunks[-1].append(i)
    return chunks


def decode_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, scale: float, chunk: DecodeChunk, out: torch.Tensor
) -> None:
    """Fill out's rows of the chunk's one-token sequences."""
    num_seqs, ctx = chunk.pad.shape[1], chunk.pad.shape[3]
    _, kvh, _, _, head_dim = kv_cache.shape
    num_heads = query.shape[1]
    kv = gather_blocks(kv_cache, chunk.blocks).view(2, kvh, num_seqs, ctx, head_dim)
    q = (query[chunk.rows] * scale).view(num_seqs, kvh, num_heads // kvh, head_dim).transpose(0, 1)  # [kvh, S, g, d]
    scores = (q.to(kv.dtype) @ kv[0].transpose(-1, -2)).float()  # [kvh, S, g, ctx]
    probs = scores.masked_fill_(chunk.pad, float("-inf")).softmax(dim=-1)
    o = probs.to(kv.dtype) @ kv[1]  # [kvh, S, g, d]
    out[chunk.rows] = o.transpose(0, 1).reshape(num_seqs, num_heads, head_dim).to(query.dtype)


def prefill_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """One sequence. query: [query_len, heads, d] (its new tokens, the last of seq_len positions)."""
    _, kvh, _, block_size, head_dim = kv_cache.shape
    num_blocks = -(-seq_len // block_size)
    kv = gather_blocks(kv_cache, block_table[:num_blocks]).view(2, kvh, num_blocks * block_size, head_dim)
    # 4-D inputs: with 3-D ones SDPA falls back to its slow math kernel on CPU.
    k, v = kv[0:1, :, :seq_len].to(query.dtype), kv[1:2, :, :seq_len].to(query.dtype)  # [1, kvh, seq_len, d]
    query_len = query.shape[0]
    q = query.transpose(0, 1).unsqueeze(0)  # [1, heads, q, d]
    if query_len == seq_len:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = causal_mask(query_len, seq_len)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)
