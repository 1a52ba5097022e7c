"""Drive an OpenAI-compatible server with streaming /v1/completions requests and time each one.

Requests arrive as a Poisson process (or all at once), at most `max_concurrency` are in flight,
and the whole run is bounded by `timeout_s`: whatever has not finished by then is cancelled and
counted as failed. Every timestamp is `time.perf_counter()` seconds.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from pagedllm.bench.sse_lines import sse_lines
from pagedllm.bench.workloads import BenchRequest
from pagedllm.errors import UserFacingError


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request."""

    index: int
    n: int = 1
    prompt_tokens: int = 0
    output_tokens: int = 0
    start: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying text, any choice
    choice_times: dict[int, list[float]] = field(default_factory=dict)  # the same, per choice index
    end: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)


@dataclass(frozen=True, slots=True)
class ClientOptions:
    base_url: str
    model: str
    request_rate: float = math.inf  # requests per second; inf sends them all at once
    max_concurrency: int | None = None
    seed: int = 0
    ignore_eos: bool = True
    seed_samples: bool = True  # send seed = seed + index with n > 1
    timeout_s: float = 1800.0  # the whole run
    extra_body: dict[str, Any] = field(default_factory=dict)


def arrival_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Send times (seconds after the start) of `count` requests of a Poisson process of `rate` per second."""
    if math.isinf(rate):
        return [0.0] * count
    if rate <= 0:
        raise ValueError("request rate must be positive")
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(count):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def request_body(index: int, req: BenchRequest, opts: ClientOptions) -> dict[str, Any]:
    """Greedy for one sample, temperature 1 with a per-request seed for n > 1 (as the offline benchmark)."""
    if req.beam:
        raise ValueError("beam search is not part of the OpenAI completions API; use `pagedllm bench throughput`")
    body: dict[str, Any] = {
        "model": opts.model, "prompt": req.prompt, "max_tokens": req.output_len, "n": req.n,
        "temperature": 0.0 if req.n == 1 else 1.0, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": opts.ignore_eos,
    }
    if req.n > 1 and opts.seed_samples:
        body["seed"] = opts.seed + index
    body.update(opts.extra_body)
    return body


async def sse_payloads(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a server-sent event stream, up to `data: [DONE]`."""
    async for line in sse_lines(response):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _output_choices(payload: dict[str, Any]) -> list[int]:
    return [int(c.get("index", 0)) for c in payload.get("choices") or [] if c.get("text")]


async def stream_one(client: httpx.AsyncClient, index: int, req: BenchRequest, opts: ClientOptions) -> RequestRecord:
    record = RequestRecord(index=index, n=req.n, start=time.perf_counter())
    try:
        async with client.stream("POST", "/v1/completions", json=request_body(index, req, opts)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {body[:200]}"
                return record
            async for payload in sse_payloads(response):
                _take(record, payload)
        if not record.chunk_times:
            record.error = "no output tokens"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        record.end = time.perf_counter()
    return record


def _take(record: RequestRecord, payload: dict[str, Any]) -> None:
    if "error" in payload:
        record.error = str(payload["error"])[:200]
    choices = _output_choices(payload)
    if choices:
        now = time.perf_counter()
        record.chunk_times.append(now)
        for index in choices:
            record.choice_times.setdefault(index, []).append(now)
    usage = payload.get("usage")
    if usage:  # the final chunk (stream_options.include_usage) carries the exact token counts
        record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        record.output_tokens = int(usage.get("completion_tokens") or 0)


async def run_requests(requests: Sequence[BenchRequest], opts: ClientOptions) -> tuple[list[RequestRecord], float]:
    """Send every request as scheduled; returns the records (in request order) and the run's duration."""
    offsets = arrival_offsets(len(requests), opts.request_rate, opts.seed)
    limit = opts.max_concurrency or len(requests) or 1
    gate = asyncio.Semaphore(limit)
    timeout = httpx.Timeout(opts.timeout_s, connect=30.0)
    limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit)
    async with httpx.AsyncClient(base_url=opts.base_url, timeout=timeout, limits=limits) as client:
        start = time.perf_counter()

        async def one(i: int) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + offsets[i] - time.perf_counter()))
            async with gate:
                return await stream_one(client, i, requests[i], opts)

        tasks = [asyncio.create_task(one(i)) for i in range(len(requests))]
        done, pending = await asyncio.wait(tasks, timeout=opts.timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        duration = time.perf_counter() - start
    return [_result(i, task) for i, task in enumerate(tasks)], duration


def _result(index: int, task: asyncio.Task[RequestRecord]) -> RequestRecord:
    if task.cancelled() or not task.done():
        return RequestRecord(index=index, error="cancelled: the run's timeout passed")
    if task.exception() is not None:
        exc = task.exception()
        return RequestRecord(index=index, error=f"{type(exc).__name__}: {exc}")
    return task.result()


async def wait_ready(base_url: str, timeout_s: float = 300.0) -> None:
    """Poll GET /health until the server answers 200 (vLLM answers once its engine runs)."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0) as client:
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise UserFacingError(f"{base_url} was not ready within {timeout_s:.0f} s")
            await asyncio.sleep(0.5)


async def model_card(base_url: str, model: str | None = None, timeout_s: float = 30.0) -> dict[str, Any]:
    """The server's /v1/models entry for `model` (default: its first), with id, root and max_model_len."""
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s) as client:
        response = await client.get("/v1/models")
        response.raise_for_status()
        cards = response.json()["data"]
    for card in cards:
        if model is None or card["id"] == model:
            return card
    return {"id": model}  # a server may answer for names it does not list
