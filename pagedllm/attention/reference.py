"""Reference paged attention: gather each sequence's K/V into contiguous tensors, then dense attention."""

import torch
import torch.nn.functional as F

from pagedllm.attention.kv_cache import gather_blocks
from pagedllm.attention.metadata import AttentionMetadata


def gather_kv(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one sequence's first seq_len positions: each [seq_len, num_kv_heads, head_dim]."""
    _, kvh, _, block_size, head_dim = kv_cache.shape
    num_blocks = -(-seq_len // block_size)
    blocks = gather_blocks(kv_cache, block_table[:num_blocks])  # [2, kvh, nb, B, d]
    blocks = blocks.reshape(2, kvh, num_blocks * block_size, head_dim)[:, :, :seq_len]
    return blocks[0].transpose(0, 1), blocks[1].transpose(0, 1)


def causal_mask(query_len: int, seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[query_len, seq_len] bool: query j (position seq_len - query_len + j) sees keys at positions <= its own."""
    q_pos = torch.arange(seq_len - query_len, seq_len, device=device).unsqueeze(1)
    return torch.arange(seq_len, device=device).unsqueeze(0) <= q_pos


def reference_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim]."""
    num_heads = query.shape[1]
    out = torch.empty_like(query)
    for i, (seq_len, query_len) in enumerate(zip(meta.seq_lens_list, meta.query_lens_list)):
        start = int(meta.query_start_loc[i])
        k, v = gather_kv(kv_cache, meta.block_tables[i], seq_len)
        group = num_heads // k.shape[1]
        k = k.repeat_interleave(group, dim=1).transpose(0, 1).to(query.dtype)  # [heads, seq, d]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1).to(query.dtype)
        q = query[start : start + query_len].transpose(0, 1)  # [heads, q, d]
        mask = causal_mask(query_len, seq_len, query.device)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[start : start + query_len] = o.transpose(0, 1)
    return out
