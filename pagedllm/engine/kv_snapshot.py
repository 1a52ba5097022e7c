"""A JSON-able picture of the KV pool: its blocks (all, or a window of them), who owns them, how full they are,
and the counts and waste of the whole pool."""

from collections import Counter
from collections.abc import Callable

from pagedllm.engine.stats import EngineStats
from pagedllm.kv.manager import KVCacheManager


def kv_snapshot(kv: KVCacheManager, stats: EngineStats, request_id_of: Callable[[int], str], offset: int = 0,
                limit: int | None = None) -> dict:
    """Blocks [offset, offset + limit) (every block from offset where limit is None); the counts, per-request
    blocks and waste always cover the whole pool, built from the block tables (a pass over every block took
    0.4 s on a pool of 175k blocks)."""
    stop = None if limit is None else offset + limit
    blocks = [
        {
            "id": int(info.block_id),
            "state": info.state,
            "ref_cnt": info.ref_cnt,
            "filled": info.filled,
            "owners": sorted({request_id_of(owner) for owner in info.owners}),
        }
        for info in kv.snapshot(offset, stop)
    ]
    return {
        "block_size": kv.block_size,
        "num_blocks": kv.num_blocks,
        "offset": offset,
        "blocks": blocks,
        **_whole_pool(kv, stats, request_id_of),
    }


def _whole_pool(kv: KVCacheManager, stats: EngineStats, request_id_of: Callable[[int], str]) -> dict:
    tables = kv.tables()
    holders = Counter(block for table in tables.values() for block in table)
    per_request: dict[str, set[int]] = {}
    for seq_id, table in tables.items():
        per_request.setdefault(request_id_of(seq_id), set()).update(table)
    used_slots = stats.blocks_used * stats.block_size
    return {
        "counts": {"used": stats.blocks_used, "shared": sum(1 for n in holders.values() if n > 1),
                   "cached": stats.blocks_cached_free, "free": stats.blocks_free - stats.blocks_cached_free},
        "requests": {request: len(held) for request, held in sorted(per_request.items())},
        "waste": {
            "used_slots": used_slots,
            "tokens_stored": stats.tokens_stored,
            "empty_tail_slots": stats.empty_tail_slots,
            "empty_tail_fraction": stats.empty_tail_slots / used_slots if used_slots else 0.0,
            "token_occupancy": stats.token_occupancy,
            "block_occupancy": stats.block_occupancy,
            "slots_reserved": stats.slots_reserved,  # allocator="contiguous": what its reservations hold
        },
        "running": stats.num_running,
        "waiting": stats.num_waiting,
        "prefix_cache": {"queries_tokens": stats.prefix_queries_tokens, "hits_tokens": stats.prefix_hits_tokens},
    }
