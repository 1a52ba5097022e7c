"""Moving a test batch onto the device the kernels run on."""

import dataclasses

import torch

from attn_helpers import Batch


def batch_on(batch: Batch, device: torch.device) -> Batch:
    """The same batch with the query, pool and metadata tensors on `device` (the host lists stay)."""
    meta = batch.meta
    moved = dataclasses.replace(
        meta,
        slot_mapping=meta.slot_mapping.to(device),
        block_tables=meta.block_tables.to(device),
        seq_lens=meta.seq_lens.to(device),
        query_start_loc=meta.query_start_loc.to(device),
        plan=None,
    )
    return dataclasses.replace(batch, query=batch.query.to(device), kv_cache=batch.kv_cache.to(device), meta=moved)
