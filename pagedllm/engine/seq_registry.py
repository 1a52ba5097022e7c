"""Sequence ids: integers from one engine-wide counter, each mapped to the request it belongs to."""

import itertools

from pagedllm.engine.completion import Completion
from pagedllm.engine.request import Request, Sequence


class SeqRegistry:
    def __init__(self) -> None:
        self._ids = itertools.count()
        self._request_of: dict[int, Request] = {}

    def __len__(self) -> int:
        return len(self._request_of)

    def new(self, request: Request, token_ids: list[int], index: int, completion: Completion | None) -> Sequence:
        seq = Sequence(next(self._ids), token_ids, len(request.prompt_token_ids), index=index, completion=completion)
        self._request_of[seq.seq_id] = request
        return seq

    def request_of(self, seq_id: int) -> Request:
        return self._request_of[seq_id]

    def release(self, seq_id: int) -> None:
        self._request_of.pop(seq_id, None)
