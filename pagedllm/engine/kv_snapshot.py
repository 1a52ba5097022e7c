"""A JSON-able picture of the KV pool: every physical block, who owns it, how full it is, and the waste."""

from typing import TYPE_CHECKING

from pagedllm.engine.request import split_seq_id

if TYPE_CHECKING:
    from pagedllm.engine.llm_engine import LLMEngine


def kv_snapshot(engine: "LLMEngine") -> dict:
    kv = engine.kv
    blocks = [
        {
            "id": int(info.block_id),
            "state": info.state,
            "ref_cnt": info.ref_cnt,
            "filled": info.filled,
            "owners": sorted({split_seq_id(owner)[0] for owner in info.owners}),
        }
        for info in kv.snapshot()
    ]
    stats = engine.stats()
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
