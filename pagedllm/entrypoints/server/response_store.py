"""Stored responses of the Responses API (`store`, `previous_response_id`, `background`), kept in memory.

Off unless the server is started with `--responses-store-size N` (as vLLM keeps none unless
VLLM_ENABLE_RESPONSES_API_STORE is set). Then up to N responses are kept, the least recently used finished one
dropped first; a background response still running is never dropped (it would be lost to its poller).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from pagedllm.entrypoints.server.errors import APIError

RUNNING = ("queued", "in_progress")  # the statuses of a background response not finished yet


@dataclass
class StoredResponse:
    response: dict[str, Any]  # the Response object as it stands (a background one's status moves on)
    conversation: list[dict[str, Any]]  # the chat messages it answered (no instructions), then its answer
    task: asyncio.Task | None = field(default=None, repr=False)  # its background run, while that runs

    @property
    def running(self) -> bool:
        return self.response["status"] in RUNNING


class ResponseStore:
    """Responses by id, least recently used first."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"a response store holds at least one response, got {max_entries}")
        self.max_entries = max_entries
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The stored response, or a 404 naming the id (as `param`)."""
        stored = self._entries.get(response_id)
        if stored is None:
            raise not_found(response_id, param)
        self._entries.move_to_end(response_id)
        return stored

    def put(self, response_id: str, stored: StoredResponse) -> None:
        self._entries[response_id] = stored
        self._entries.move_to_end(response_id)
        for old in [key for key, entry in self._entries.items() if not entry.running and key != response_id]:
            if len(self._entries) <= self.max_entries:
                break
            del self._entries[old]


def not_found(response_id: str, param: str = "response_id") -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", type_="not_found_error", param=param,
                    code="response_not_found")
