"""triton_attention: the Triton implementation of paged_attention(query, kv_cache, meta, scale).

Sequences with one new token go to the split decode kernel plus the merge kernel; sequences with more
(prompts, chunked prefill) go to the prefill kernel in tiles of new tokens. The launch lists are built
once per step from the metadata's host lists, sent to the device in one copy and kept in meta.plan for the
other layers. decode_only_plan is the fixed plan a CUDA graph of a decode-only step is captured with.
"""

from dataclasses import dataclass

import torch

from pagedllm.attention.metadata import AttentionMetadata
from pagedllm.attention.triton.loader import check_device, kernels
from pagedllm.engine.device import to_device_packed

BLOCK_N = 32  # keys per tile
MIN_SPLIT_TOKENS = 256  # shorter splits cost more in partials and merging than they gain in parallelism
PROGRAMS_PER_SM = 4


@dataclass(slots=True)
class TritonPlan:
    decode_ids: torch.Tensor  # [num_decode] int64: sequences with one new token
    decode_rows: torch.Tensor  # [num_decode] int64: their query rows
    split_len: int  # keys per decode split
    num_splits: int
    tile_seq: torch.Tensor  # [num_tiles] int64: the sequence of each prefill query tile
    tile_start: torch.Tensor  # [num_tiles] int64: its first new token, counted within the sequence
    block_m: int  # new tokens per prefill tile
    requested_split: int | None  # the split_len the caller asked for (None = chosen here)


def triton_attention(
    query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata, scale: float, split_len: int | None = None
) -> torch.Tensor:
    """query: [num_tokens, num_heads, head_dim] -> [num_tokens, num_heads, head_dim].

    split_len: keys per decode split; by default chosen from the batch and the GPU's SM count.
    """
    check_device(query)
    if query.stride(-1) != 1:
        query = query.contiguous()  # the kernels read head_dim as one contiguous row; other strides are free
    ops = kernels()
    plan = meta.plan
    if not isinstance(plan, TritonPlan) or plan.requested_split != split_len:
        plan = meta.plan = make_plan(meta, query, kv_cache, split_len)
    out = torch.empty_like(query)
    if plan.decode_ids.numel():
        partials = ops["decode"].launch_decode(
            query, kv_cache, meta.block_tables, meta.seq_lens, plan.decode_ids, plan.decode_rows,
            scale, plan.split_len, plan.num_splits, BLOCK_N,
        )
        merge = ops["split_merge"].launch_merge
        merge(*partials, meta.seq_lens, plan.decode_ids, plan.decode_rows, plan.split_len, out)
    if plan.tile_seq.numel():
        tensors = (meta.block_tables, meta.seq_lens, meta.query_start_loc)
        ops["prefill"].launch_prefill(
            query, kv_cache, out, tensors, plan.tile_seq, plan.tile_start, scale, plan.block_m, BLOCK_N
        )
    return out


def make_plan(
    meta: AttentionMetadata, query: torch.Tensor, kv_cache: torch.Tensor, split_len: int | None
) -> TritonPlan:
    if split_len is not None and split_len < 1:
        raise ValueError(f"split_len must be positive, got {split_len}")
    kvh = kv_cache.shape[1]
    block_m = kernels()["prefill"].prefill_block_m(query.shape[1] // kvh)
    decode, rows, tile_seq, tile_start = work_lists(meta.query_lens_list, block_m)
    longest = max((meta.seq_lens_list[i] for i in decode), default=1)
    chosen = split_len or default_split_len(longest, len(decode) * kvh, query.device)
    lists = [torch.tensor(xs, dtype=torch.int64) for xs in (decode, rows, tile_seq, tile_start)]
    decode_ids, decode_rows, seqs, starts = to_device_packed(lists, query.device, "attention plan")  # one copy
    return TritonPlan(decode_ids, decode_rows, chosen, -(-longest // chosen), seqs, starts, block_m, split_len)


def decode_only_plan(num_seqs: int, longest: int, num_heads: int, kv_cache: torch.Tensor) -> TritonPlan:
    """A fixed plan for num_seqs one-token sequences (rows 0..num_seqs-1) of at most `longest` tokens.

    It does not depend on the lengths (splits past a sequence's end do nothing and the merge skips them),
    so a CUDA graph captured with it replays for any decode step of that batch size.
    """
    device = kv_cache.device
    kvh = kv_cache.shape[1]
    split = default_split_len(longest, num_seqs * kvh, device)
    seqs = torch.arange(num_seqs, dtype=torch.int64, device=device)
    none = torch.empty(0, dtype=torch.int64, device=device)
    block_m = kernels()["prefill"].prefill_block_m(num_heads // kvh)
    return TritonPlan(seqs, seqs, split, -(-longest // split), none, none, block_m, None)


def work_lists(query_lens: list[int], block_m: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Decode sequences and their query rows; prefill tiles as (sequence, first new token of the tile)."""
    decode, rows, tile_seq, tile_start = [], [], [], []
    row = 0
    for i, q_len in enumerate(query_lens):
        if q_len == 1:
            decode.append(i)
            rows.append(row)
        elif q_len > 1:
            starts = range(0, q_len, block_m)
            tile_seq.extend([i] * len(starts))
            tile_start.extend(starts)
        row += q_len
    return decode, rows, tile_seq, tile_start


def default_split_len(longest: int, programs_per_split: int, device: torch.device) -> int:
    """Enough splits to give every SM a few programs, none shorter than MIN_SPLIT_TOKENS; a multiple of BLOCK_N."""
    if device.type != "cuda":
        return -(-longest // BLOCK_N) * BLOCK_N  # the interpreter: one split
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    splits = max(1, -(-PROGRAMS_PER_SM * sms // max(1, programs_per_split)))
    tokens = max(MIN_SPLIT_TOKENS, -(-longest // splits))
    return -(-tokens // BLOCK_N) * BLOCK_N
