"""Block-wise paged attention: softmax partials per part of the block table, merged exactly.

Each part is `blocks_per_part` consecutive logical blocks of a sequence. For every (sequence, query row,
part) the local max, local sum of exponentials and locally normalised output are computed in one batched
matmul over all sequences and parts, then merge.merge_partials combines the parts. The maths runs in
float32 whatever the cache dtype.
"""

import torch

from pagedllm.attention.groups import SeqGroup, make_group, split_decode_prefill
from pagedllm.attention.kv_cache import gather_blocks
from pagedllm.attention.merge import merge_partials, softmax_partial
from pagedllm.attention.metadata import AttentionMetadata


def default_blocks_per_part(block_size: int) -> int:
    return max(1, 64 // block_size)  # parts of ~64 tokens: few enough partials, matmuls big enough


def blockwise_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    blocks_per_part: int | None = None,
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
    bpp = blocks_per_part or default_blocks_per_part(meta.block_size)
    out = torch.zeros_like(query)
    # Decode and prefill sequences are padded separately, so one long prompt does not pad every decode.
    for seq_ids in split_decode_prefill(meta):
        if seq_ids:
            group = make_group(meta, seq_ids, bpp)
            out[group.token_index[group.valid]] = _group_attention(query, kv_cache, group, scale, bpp)
    return out


def _group_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, group: SeqGroup, scale: float, bpp: int
) -> torch.Tensor:
    """Attention for one padded group; returns the valid query rows: [group_tokens, heads, d]."""
    num_seqs, qmax = group.token_index.shape
    _, kvh, _, block_size, head_dim = kv_cache.shape
    num_heads = query.shape[1]
    g = num_heads // kvh
    num_parts = group.block_tables.shape[1] // bpp
    part_len = bpp * block_size

    kv = gather_blocks(kv_cache, group.block_tables.flatten()).float()  # [2, kvh, S*nb, B, d]
    kv = kv.view(2, kvh, num_seqs, num_parts, part_len, head_dim)
    q = query[group.token_index].float() * scale  # [S, qmax, H, d]
    q = q.view(num_seqs, qmax, kvh, g, head_dim).permute(2, 0, 3, 1, 4)  # [kvh, S, g, qmax, d]
    q = q.reshape(kvh, num_seqs, 1, g * qmax, head_dim)  # rows r = (g, qmax)

    scores = q @ kv[0].transpose(-1, -2)  # [kvh, S, P, R, part_len]
    scores = scores.view(kvh, num_seqs, num_parts, g, qmax, part_len)
    scores.masked_fill_(~_mask(group, num_parts, part_len), float("-inf"))
    scores = scores.view(kvh, num_seqs, num_parts, g * qmax, part_len)
    m, l, o = softmax_partial(scores, kv[1])  # m, l: [kvh, S, P, R]; o: [kvh, S, P, R, d]
    _, _, o = merge_partials(m, l, o, dim=2)  # [kvh, S, R, d]

    o = o.view(kvh, num_seqs, g, qmax, head_dim).permute(1, 3, 0, 2, 4)  # [S, qmax, kvh, g, d]
    o = o.reshape(num_seqs, qmax, num_heads, head_dim)
    return o[group.valid].to(query.dtype)


def _mask(group: SeqGroup, num_parts: int, part_len: int) -> torch.Tensor:
    """[1, S, P, 1, qmax, part_len] bool, True = attend: key position <= query position, real query rows."""
    key_pos = torch.arange(num_parts * part_len).view(1, num_parts, 1, part_len)  # [1, P, 1, part_len]
    query_pos = group.query_pos.masked_fill(~group.valid, -1)  # padded rows see nothing
    mask = key_pos <= query_pos.view(-1, 1, query_pos.shape[1], 1)  # [S, P, qmax, part_len]
    return mask.unsqueeze(0).unsqueeze(3)
