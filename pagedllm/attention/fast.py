"""The fast CPU path ("auto"): batched padded matmuls for decode, SDPA per prompt for prefill.

- Decode sequences (one new token): sorted by context length and cut into chunks of bounded size; per
  chunk, one gather of the blocks, padded to the chunk's longest context, and two batched matmuls over
  (KV head, sequence) with a group's query heads as rows (GQA without copying K/V); softmax in float32
  with positions >= seq_len masked.
- Prefill sequences: gather the sequence's blocks, then torch SDPA (enable_gqa) with is_causal when there
  is no cached prefix, or an explicit causal mask offset by the cached length (chunked prefill).
"""

import torch
import torch.nn.functional as F

from pagedllm.attention.groups import make_group, split_decode_prefill
from pagedllm.attention.kv_cache import gather_blocks
from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.attention.reference import causal_mask


GATHER_BUDGET_BYTES = 8 << 20


def fast_attention(query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
    out = torch.empty_like(query)
    decode, prefill = split_decode_prefill(meta)
    for chunk in decode_chunks(meta, decode, kv_cache):
        decode_attention(query, kv_cache, meta, scale, chunk, out)
    for i in prefill:
        start, query_len = int(meta.query_start_loc[i]), meta.query_lens_list[i]
        rows = slice(start, start + query_len)
        out[rows] = prefill_attention(query[rows], kv_cache, meta.block_tables[i], meta.seq_lens_list[i], scale)
    return out


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
    query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, seq_ids: list[int], out: torch.Tensor
) -> None:
    """Fill out's rows of the one-token sequences seq_ids."""
    group = make_group(meta, seq_ids)
    num_seqs = len(seq_ids)
    _, kvh, _, block_size, head_dim = kv_cache.shape
    num_heads = query.shape[1]
    ctx = group.block_tables.shape[1] * block_size

    kv = gather_blocks(kv_cache, group.block_tables.flatten()).view(2, kvh, num_seqs, ctx, head_dim)
    rows = group.token_index[:, 0]  # [S]
    q = (query[rows] * scale).view(num_seqs, kvh, num_heads // kvh, head_dim).transpose(0, 1)  # [kvh, S, g, d]
    scores = (q.to(kv.dtype) @ kv[0].transpose(-1, -2)).float()  # [kvh, S, g, ctx]
    pad = torch.arange(ctx).unsqueeze(0) >= group.seq_lens.unsqueeze(1)  # [S, ctx]
    probs = scores.masked_fill_(pad.view(1, num_seqs, 1, ctx), float("-inf")).softmax(dim=-1)
    o = probs.to(kv.dtype) @ kv[1]  # [kvh, S, g, d]
    out[rows] = o.transpose(0, 1).reshape(num_seqs, num_heads, head_dim).to(query.dtype)


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
