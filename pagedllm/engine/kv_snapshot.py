"""A JSON-able picture of the KV pool: every physical block, who owns it, how full it is, and the waste."""

from collections.abc import Callable

from pagedllm.engine.stats import EngineStats
from pagedllm.kv.manager import KVCacheManager


def kv_snapshot(kv: KVCacheManager, stats: EngineStats, request_id_of: Callable[[int], str]) -> dict:
    blocks = [
        {
            "id": int(info.block_id),
            "state": info.state,
            "ref_cnt": info.ref_cnt,
            "filled": info.filled,
            "owners": sorted({request_id_of(owner) for owner in info.owners}),
        }
        for info in kv.snapshot()
    ]
    used_slots = stats.blocks_used * stats.block_size
    return {
        "block_size": kv.block_size,
        "num_blocks": kv.num_blocks,
        "blocks": blocks,
        "waste": {
            "used_slots": used_slots,
            "tokens_stored": stats.tokens_stored,
            "empty_tail_slots": used_slots - stats.tokens_stored,  # internal fragmentation of used blocks
            "empty_tail_fraction": (used_slots - stats.tokens_stored) / used_slots if used_slots else 0.0,
            "token_occupancy": stats.token_occupancy,
            "block_occupancy": stats.block_occupancy,
        },
        "running": stats.num_running,
        "waiting": stats.num_waiting,
        "prefix_cache": {"queries_tokens": stats.prefix_queries_tokens, "hits_tokens": stats.prefix_hits_tokens},
    }
