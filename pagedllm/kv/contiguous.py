"""The baseline the paper compares against: one run of adjacent slots per request, first fit.

A flat slot space of `num_slots` slots. Each request reserves, when admitted, a single run sized
either for the model's maximum length ("max_len") or for its prompt plus max_tokens ("exact").
Because a request needs *one* run, a request is refused whenever no single free run is long
enough, even if the free slots add up to more than it needs: that is external fragmentation.
"""

from dataclasses import dataclass
from typing import Literal

from pagedllm.errors import InvalidInputError
from pagedllm.kv.ids import SeqId

ContiguousPolicy = Literal["max_len", "exact"]
POLICIES: tuple[str, ...] = ("max_len", "exact")


@dataclass(slots=True)
class Reservation:
    """The per-request view: slots [start, start + reserved), the first `used` of which hold tokens."""

    seq_id: SeqId
    start: int
    reserved: int
    used: int
    final_len: int | None = None  # where the request will stop, when known

    @property
    def end(self) -> int:
        return self.start + self.reserved


class ContiguousAllocator:
    """First-fit allocator of contiguous runs. Free runs are kept sorted by start and coalesced."""

    def __init__(self, num_slots: int, max_len: int, policy: ContiguousPolicy = "max_len") -> None:
        if num_slots <= 0 or max_len <= 0:
            raise InvalidInputError(f"num_slots and max_len must be positive, got {num_slots} and {max_len}")
        if policy not in POLICIES:
            raise InvalidInputError(f"unknown contiguous policy {policy!r}; choose one of {', '.join(POLICIES)}")
        self.num_slots = num_slots
        self.max_len = max_len
        self.policy = policy
        self._free: list[list[int]] = [[0, num_slots]]  # [start, length], sorted by start
        self._seqs: dict[SeqId, Reservation] = {}

    # --- sizing -------------------------------------------------------------------------------
    def reservation_size(self, prompt_len: int, max_tokens: int) -> int:
        """Slots a request reserves under this allocator's policy."""
        if self.policy == "max_len":
            return self.max_len
        return min(prompt_len + max_tokens, self.max_len)

    def _first_fit(self, size: int) -> int | None:
        for i, (_, length) in enumerate(self._free):
            if length >= size:
                return i
        return None

    def _fits(self, prompt_len: int, max_tokens: int) -> bool:
        size = self.reservation_size(prompt_len, max_tokens)
        return prompt_len <= size and self._first_fit(size) is not None

    def allocate(
        self, seq_id: SeqId, prompt_len: int, max_tokens: int, final_len: int | None = None
    ) -> Reservation | None:
        """Reserve one run for the request and mark its prompt used; None when no run fits."""
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already holds a reservation")
        if not self._fits(prompt_len, max_tokens):
            return None
        size = self.reservation_size(prompt_len, max_tokens)
        run = self._free[self._first_fit(size)]  # type: ignore[index]
        start = run[0]
        run[0] += size
        run[1] -= size
        if run[1] == 0:
            self._free.remove(run)
        res = Reservation(seq_id, start, size, prompt_len, final_len)
        self._seqs[seq_id] = res
        return res

    def can_append(self, seq_id: SeqId, num_tokens: int = 1) -> bool:
        res = self._seqs[seq_id]
        return res.used + num_tokens <= res.reserved

    def append(self, seq_id: SeqId, num_tokens: int = 1) -> bool:
        """Use the next slots of the reservation; False (and no change) when it is exhausted."""
        if not self.can_append(seq_id, num_tokens):
            return False
        self._seqs[seq_id].used += num_tokens
        return True

    def free(self, seq_id: SeqId) -> None:
        res = self._seqs.pop(seq_id)
        self._insert_free(res.start, res.reserved)

    def _insert_free(self, start: int, length: int) -> None:
        runs = self._free
        i = 0
        while i < len(runs) and runs[i][0] < start:
            i += 1
        runs.insert(i, [start, length])
        # coalesce with the right neighbour, then the left one
        if i + 1 < len(runs) and runs[i][0] + runs[i][1] == runs[i + 1][0]:
            runs[i][1] += runs.pop(i + 1)[1]
        if i > 0 and runs[i - 1][0] + runs[i - 1][1] == runs[i][0]:
            runs[i - 1][1] += runs.pop(i)[1]

    # --- views --------------------------------------------------------------------------------
    def has_seq(self, seq_id: SeqId) -> bool:
        return seq_id in self._seqs

    def reservation(self, seq_id: SeqId) -> Reservation:
        return self._seqs[seq_id]

    def reservations(self) -> list[Reservation]:
        return sorted(self._seqs.values(), key=lambda r: r.start)

    def free_runs(self) -> list[tuple[int, int]]:
        """(start, length) of every free run, by start."""
        return [(s, n) for s, n in self._free]

    @property
    def num_free_slots(self) -> int:
        return sum(n for _, n in self._free)

    @property
    def largest_free_run(self) -> int:
        return max((n for _, n in self._free), default=0)

    def check_invariants(self) -> None:
        """Runs and reservations tile [0, num_slots) exactly, free runs are coalesced."""
        pieces = [(s, n, "free") for s, n in self._free]
        pieces += [(r.start, r.reserved, "seq") for r in self._seqs.values()]
        pieces.sort()
        pos = 0
        for start, length, _ in pieces:
            assert start == pos and length > 0, f"gap or overlap at slot {pos}"
            pos += length
        assert pos == self.num_slots, "slots lost"
        for (s1, n1), (s2, _) in zip(self._free, self._free[1:]):
            assert s1 + n1 < s2, "adjacent free runs not coalesced"
        for r in self._seqs.values():
            assert 0 <= r.used <= r.reserved
