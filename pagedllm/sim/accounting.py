"""Where the slots of a KV pool go, for a contiguous or a paged allocator, at one moment.

Every slot of the pool falls in exactly one category (they add up to `pool`):

- tokens       holds a real token (a block shared by several sequences counts once)
- reservation  allocated to a request, empty now, and the request will fill it later
- internal     allocated to a request that will never fill it (known once its final length is
               known; while the final length is unknown an empty allocated slot counts as reservation)
- external     free, but in a run too short for the next waiting request (contiguous only: any free
               block fits a paged request, so paged pools have none)
- free         free and usable

Token occupancy = tokens / pool. Block occupancy = (tokens + reservation + internal) / pool, i.e.
the slots inside allocated runs or blocks. The two differ by exactly the allocated-but-empty slots.
"""

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Protocol

from pagedllm.kv.block_table import empty_tail_slots
from pagedllm.kv.contiguous import ContiguousAllocator
from pagedllm.kv.ids import SeqId


@dataclass(slots=True)
class MemoryReport:
    pool: int
    tokens: int
    reservation: int
    internal: int
    external: int
    free: int

    @property
    def waste(self) -> int:
        return self.reservation + self.internal + self.external

    @property
    def allocated(self) -> int:
        return self.tokens + self.reservation + self.internal

    @property
    def token_occupancy(self) -> float:
        return self.tokens / self.pool

    @property
    def block_occupancy(self) -> float:
        return self.allocated / self.pool

    def pct(self, slots: int) -> float:
        return 100.0 * slots / self.pool

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    def check(self) -> None:
        parts = (self.tokens, self.reservation, self.internal, self.external, self.free)
        assert min(parts) >= 0 and sum(parts) == self.pool, f"categories do not tile the pool: {self}"


def split_slack(used: int, capacity: int, final_len: int | None) -> tuple[int, int]:
    """(reservation, internal) for the empty slots [used, capacity) of one request."""
    empty = capacity - used
    if final_len is None:
        return empty, 0
    will_fill = max(0, min(final_len, capacity) - used)
    return will_fill, empty - will_fill


def external_slots(free_runs: Iterable[int], next_need: int | None) -> int:
    """Free slots in runs shorter than what the next waiting request needs (0 when nobody waits)."""
    if next_need is None:
        return 0
    return sum(n for n in free_runs if n < next_need)


def contiguous_report(alloc: ContiguousAllocator, next_need: int | None = None) -> MemoryReport:
    """`next_need`: the run size the head of the waiting queue would reserve, if any."""
    tokens = reservation = internal = 0
    for res in alloc.reservations():
        r, i = split_slack(res.used, res.reserved, res.final_len)
        tokens, reservation, internal = tokens + res.used, reservation + r, internal + i
    runs = [n for _, n in alloc.free_runs()]
    external = external_slots(runs, next_need)
    free = sum(runs) - external
    return MemoryReport(alloc.num_slots, tokens, reservation, internal, external, free)


class PagedView(Protocol):
    """What accounting needs from a KVCacheManager."""

    @property
    def num_used_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    def num_tokens(self, seq_id: SeqId) -> int: ...


def paged_report(manager: PagedView, block_size: int, final_lens: Mapping[SeqId, int | None]) -> MemoryReport:
    """`final_lens` maps every live sequence id to its final length (None when unknown).

    Only a sequence's tail block can be partly empty (shared blocks are full ones), so the empty
    slots are exactly the tails, and real tokens are the used blocks' slots minus the tails.
    Free-but-cached prefix blocks count as free: they are evictable.
    """
    reservation = internal = empty = 0
    for seq_id, final_len in final_lens.items():
        used = manager.num_tokens(seq_id)
        tail = empty_tail_slots(used, block_size)
        r, i = split_slack(used, used + tail, final_len)
        reservation, internal, empty = reservation + r, internal + i, empty + tail
    used_slots = manager.num_used_blocks * block_size
    pool = (manager.num_used_blocks + manager.num_free_blocks) * block_size
    free = manager.num_free_blocks * block_size
    return MemoryReport(pool, used_slots - empty, reservation, internal, 0, free)
