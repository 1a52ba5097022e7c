"""allocator="contiguous": admission as a max-length contiguous reservation system would do it.

The baseline that PagedAttention replaces: every sequence reserves one run of adjacent slots long enough
for the model's maximum length before it may start, first fit over a flat space the size of the KV
pool. Blocks still come from the paged pool (so the model code is the same); only admission, and
therefore concurrency, follows the contiguous rule. This shows on a real model what paging buys.
"""

import itertools

from pagedllm.engine.request import Request
from pagedllm.kv.contiguous import ContiguousAllocator
from pagedllm.kv.ids import SeqId


class ContiguousReservations:
    def __init__(self, num_slots: int, max_len: int) -> None:
        self.allocator = ContiguousAllocator(num_slots, max_len, policy="max_len")
        self._runs: dict[str, list[SeqId]] = {}  # request id -> its runs (one per sequence it can grow to)
        self._keys = itertools.count()

    def reserve(self, request: Request) -> bool:
        """Reserve one max-length run per sequence the request can grow to; all or nothing."""
        if request.request_id in self._runs:
            return True  # reserved at first admission; kept through preemption
        prompt_len = len(request.prompt_token_ids)
        max_tokens = request.max_total_len - prompt_len
        runs = self._runs[request.request_id] = []
        for _ in range(request.width):
            key = SeqId(next(self._keys))
            if self.allocator.allocate(key, prompt_len, max_tokens) is None:
                self.release(request)
                return False
            runs.append(key)
        return True

    @property
    def num_reserved_slots(self) -> int:
        return self.allocator.num_slots - self.allocator.num_free_slots

    def release(self, request: Request) -> None:
        for key in self._runs.pop(request.request_id, []):
            self.allocator.free(key)
