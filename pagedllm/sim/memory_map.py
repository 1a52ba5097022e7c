"""The pool at one step of a simulation, as data: who holds which slots or blocks, and how full they are."""

from dataclasses import dataclass, field

from pagedllm.sim.accounting import MemoryReport


@dataclass(slots=True)
class MapEntry:
    """One live request: `used` tokens in `capacity` slots (its run, or its blocks)."""

    label: str
    used: int
    final_len: int | None
    capacity: int
    start: int | None = None  # contiguous: first slot of its run
    blocks: list[int] = field(default_factory=list)  # paged: its block table


@dataclass(slots=True)
class MemoryMap:
    policy: str
    step: int
    pool_slots: int
    block_size: int | None  # None: contiguous
    entries: list[MapEntry]
    report: MemoryReport | None = None
    cached_blocks: list[int] = field(default_factory=list)  # free but holding a cached prefix
    free_runs: list[tuple[int, int]] = field(default_factory=list)  # contiguous
    next_need: int | None = None  # contiguous: the run the head of the queue needs
