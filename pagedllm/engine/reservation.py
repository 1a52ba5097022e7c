"""allocator="contiguous": admission as a max-length contiguous reservation system would do it.

The baseline that PagedAttention replaces: every sequence reserves one run of adjacent slots long enough
for the model's maximum length before it may start, first fit over a flat space the size of the KV
pool. Blocks still come from the paged pool (so the model code is the same); only admission, and
therefore concurrency, follows the contiguous rule. This shows on a real model what paging buys.
"""

from pagedllm.engine.request import Request
from pagedllm.kv.contiguous import ContiguousAllocator


class ContiguousReservations:
    def __init__(self, num_slots: int, max_len: int) -> None:
        self.allocator = ContiguousAllocator(num_slots, max_len, policy="max_len")

    def reserve(self, request: Request) -> bool:
        """Reserve one max-length run per sequence the request can grow to; all or nothing."""
        if self.allocator.has_seq(_key(request, 0)):
            return True  # reserved at first admission; kept through preemption
        prompt_len = len(request.prompt_token_ids)
        max_tokens = request.max_total_len - prompt_len
        for i in range(_width(request)):
            if self.allocator.allocate(_key(request, i), prompt_len, max_tokens) is None:
                self.release(request)
                return False
        return True

    def release(self, request: Request) -> None:
        for i in range(_width(request)):
            if self.allocator.has_seq(_key(request, i)):
                self.allocator.free(_key(request, i))


def _width(request: Request) -> int:
    params = request.params
    return params.beam_width if params.use_beam_search else params.n


def _key(request: Request, index: int) -> str:
    return f"{request.request_id}/{index}"
