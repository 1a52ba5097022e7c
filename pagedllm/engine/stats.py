"""Engine-level statistics, available at any time."""

from dataclasses import dataclass


@dataclass(slots=True)
class EngineStats:
    num_blocks: int
    block_size: int
    blocks_used: int
    blocks_free: int  # includes cached-free blocks (evictable)
    blocks_cached_free: int
    tokens_stored: int  # slots holding real tokens in used blocks
    token_occupancy: float  # tokens_stored / (num_blocks * block_size)
    block_occupancy: float  # blocks_used / num_blocks
    prefix_queries_tokens: int
    prefix_hits_tokens: int
    num_preemptions: int
    num_running: int  # requests
    num_waiting: int  # requests
    prompt_tokens_total: int  # prompt tokens computed (prefix hits excluded)
    generation_tokens_total: int
    running_seqs_peak: int = 0  # most sequences running in one step so far
    running_seqs_mean: float = 0.0  # sequences running per step, mean over the steps that ran any
    running_seqs_last: int = 0  # sequences running in the latest step
    slots_reserved: int = 0  # allocator="contiguous": slots its max-length reservations hold (0 when paged)

    @property
    def empty_tail_slots(self) -> int:
        """Slots of used blocks that hold no token: the running sequences' tails, not yet filled."""
        return self.blocks_used * self.block_size - self.tokens_stored
