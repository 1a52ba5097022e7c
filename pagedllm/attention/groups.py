"""Padded per-sequence views of a flat mixed batch, built with tensor ops (no loop per token or block)."""

from dataclasses import dataclass

import torch

from pagedllm.attention.metadata import AttentionMetadata


@dataclass(slots=True)
class SeqGroup:
    """Some of the batch's sequences, padded to the longest query and the longest context among them."""

    token_index: torch.Tensor  # [S, qmax] int64: row of `query` for (seq, j); clamped to a valid row where padded
    valid: torch.Tensor  # [S, qmax] bool: j < query_len
    query_pos: torch.Tensor  # [S, qmax] int64: absolute position of query j = num_cached + j
    seq_lens: torch.Tensor  # [S] int64
    block_tables: torch.Tensor  # [S, num_blocks] int64: enough blocks for the longest context in the group
    max_seq_len: int


def split_decode_prefill(meta: AttentionMetadata) -> tuple[list[int], list[int]]:
    """Indices of sequences with exactly one new token, and of the others (prefill or chunked prefill)."""
    decode = [i for i, q in enumerate(meta.query_lens_list) if q == 1]
    prefill = [i for i, q in enumerate(meta.query_lens_list) if q > 1]
    return decode, prefill


def make_group(meta: AttentionMetadata, seq_ids: list[int], blocks_multiple: int = 1) -> SeqGroup:
    """Padded view of sequences seq_ids; the block count is rounded up to a multiple of blocks_multiple."""
    ids = torch.tensor(seq_ids, dtype=torch.int64)
    qmax = max(meta.query_lens_list[i] for i in seq_ids)
    max_seq_len = max(meta.seq_lens_list[i] for i in seq_ids)
    query_lens = torch.tensor([meta.query_lens_list[i] for i in seq_ids], dtype=torch.int64)
    seq_lens = meta.seq_lens[ids]
    j = torch.arange(qmax)
    valid = j.unsqueeze(0) < query_lens.unsqueeze(1)
    token_index = torch.where(valid, meta.query_start_loc[ids].unsqueeze(1) + j, 0)
    query_pos = (seq_lens - query_lens).unsqueeze(1) + j
    return SeqGroup(token_index, valid, query_pos, seq_lens, _tables(meta, ids, max_seq_len, blocks_multiple), max_seq_len)


def _tables(meta: AttentionMetadata, ids: torch.Tensor, max_seq_len: int, multiple: int) -> torch.Tensor:
    needed = -(-max_seq_len // meta.block_size)
    width = -(-needed // multiple) * multiple
    tables = meta.block_tables[ids, : min(needed, meta.block_tables.shape[1])]
    if tables.shape[1] < width:  # padding blocks are masked out; block 0 is as good as any
        tables = torch.nn.functional.pad(tables, (0, width - tables.shape[1]))
    return tables
