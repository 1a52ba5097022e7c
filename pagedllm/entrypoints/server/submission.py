"""One HTTP call's engine requests: admission, collection, and abort when the caller leaves."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import TypeVar

from fastapi import Request

from pagedllm.engine.async_engine import AsyncEngine, OutputStream
from pagedllm.engine.outputs import RequestOutput
from pagedllm.entrypoints.protocol import SamplingFields
from pagedllm.entrypoints.server.errors import APIError, model_not_found, overloaded
from pagedllm.sampling_params import SamplingParams

T = TypeVar("T")
# each admitted call's requests, where `pagedllm serve --enable-log-requests` sets this logger to INFO (vLLM's flag):
# their ids, prompt lengths and sampling parameters; at DEBUG their prompt token ids too
request_log = logging.getLogger("pagedllm.requests")


class Submission:
    """Prompts of one call, each an engine request '<key>-<index>' (a readable name, never parsed back:
    a map gives each request's prompt index), all feeding one stream. The id (the response's) is
    '<prefix>-<random hex>', or '<prefix>-<request_id>' where the body gives vLLM's request_id; the key is the id,
    with random hex after a client's id, which other calls may use too."""

    def __init__(self, engine: AsyncEngine, prefix: str, request_id: str | None = None) -> None:
        self.engine = engine
        self.id = f"{prefix}-{request_id or uuid.uuid4().hex}"
        self._key = f"{self.id}-{uuid.uuid4().hex}" if request_id else self.id
        self.created = int(time.time())
        self.stream = OutputStream()
        self.request_ids: list[str] = []
        self.prompts: list[list[int]] = []  # token ids, by prompt index
        self._index_of: dict[str, int] = {}
        self._finished: set[str] = set()

    def prompt_index(self, output: RequestOutput) -> int:
        return self._index_of[output.request_id]

    @property
    def prompt_lengths(self) -> list[int]:
        return [len(prompt) for prompt in self.prompts]

    async def add(self, prompts: list[list[int]], params: SamplingParams, cache_salt: str | None = None,
                  priority: int = 0) -> None:
        """Every prompt in one engine command: they join the same step (one at a time, a list of N prompts took
        N steps to admit, and its first requests could finish before its last were in)."""
        self.request_ids = [f"{self._key}-{index}" for index in range(len(prompts))]
        self.prompts = prompts
        self._index_of = {request_id: index for index, request_id in enumerate(self.request_ids)}
        try:
            await self.engine.add_requests(list(zip(self.request_ids, prompts)), params, self.stream, cache_salt,
                                           priority)
        except BaseException:
            self.abort_unfinished()
            raise

    async def outputs(self) -> AsyncIterator[RequestOutput]:
        async for output in self.stream:
            if output.finished:
                self._finished.add(output.request_id)
            yield output

    async def collect(self) -> list[RequestOutput]:
        """The final output of every prompt, in prompt order."""
        finals: dict[str, RequestOutput] = {}
        async for output in self.outputs():
            if output.finished:
                finals[output.request_id] = output
        return [finals[request_id] for request_id in self.request_ids]

    def abort_unfinished(self) -> None:
        for request_id in self.request_ids:
            if request_id not in self._finished:
                self.engine.abort(request_id)


def check_model(engine: AsyncEngine, name: str | None) -> None:
    if name is not None and name != engine.model_name:
        raise model_not_found(name)


def check_capacity(engine: AsyncEngine) -> None:
    """503 when too many requests wait; checked first, so an overloaded server parses nothing."""
    if engine.is_overloaded():
        raise overloaded()


async def submit(engine: AsyncEngine, prefix: str, prompts: list[list[int]], params: SamplingParams,
                 body: SamplingFields, headers: Mapping[str, str]) -> Submission:
    """Hand tokenized, checked prompts to the engine as one submission (503 when overloaded), with the body's
    cache_salt, priority and request_id; as in vLLM, an X-Request-Id header overrides the request_id and an
    X-Vllm-Priority header that reads as an integer the priority."""
    check_capacity(engine)  # again: others may have been admitted while this one was tokenized
    submission = Submission(engine, prefix, headers.get("x-request-id") or body.request_id)
    await submission.add(prompts, params, body.cache_salt, _header_int(headers, "x-vllm-priority", body.priority))
    if request_log.isEnabledFor(logging.INFO):
        request_log.info("received %s: prompt tokens %s, %s", ", ".join(submission.request_ids),
                         [len(p) for p in prompts], params)
        request_log.debug("prompt token ids of %s: %s", submission.id, prompts)
    return submission


def _header_int(headers: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(headers[name])
    except (KeyError, ValueError):
        return default


async def until_disconnected(request: Request, work: Awaitable[T], submission: Submission) -> T:
    """Await work; if the client goes away first, abort the submission's requests."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
        if not work_task.done():
            work_task.cancel()
            submission.abort_unfinished()
            raise APIError(400, "the client disconnected")  # nobody reads it; ends the handler
        return work_task.result()
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
            submission.abort_unfinished()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
