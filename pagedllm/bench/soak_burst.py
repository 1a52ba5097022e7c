"""One soak burst: concurrent streaming chats, some hanging up mid-stream, with bad requests mixed in.

Counts what a healthy server must never do: a 5xx, a stream that ends without [DONE], a bad
request answered anything but a 4xx with OpenAI's error JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, field

import httpx

from pagedllm.bench.sse_lines import sse_lines

# Bodies every server must refuse with a 4xx (raw JSON, so that it can hold what json.dumps won't write).
BAD_BODIES: list[tuple[str, bytes]] = [
    ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 4}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}'),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1000000000}'),
    ("/v1/completions", b'{"prompt": "x", "temperature": Infinity}'),
    ("/v1/completions", b'{"prompt": "x", "stop_token_ids": [1000000000]}'),
    ("/v1/completions", b'{"prompt": "x", "best_of": 3}'),
    ("/v1/completions", b'{"prompt": "x", "cache_salt": ""}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"'),
    ("/v1/completions", b'{"prompt": "' + b"Each sequence owns a block table. " * 30000 + b'"}'),
]


@dataclass
class BurstResult:
    completed: int = 0
    disconnected: int = 0
    refused: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(slots=True)
class BurstPlan:
    streams: int
    disconnects: int
    bad_requests: int
    max_tokens: int
    model: str


async def run_burst(client: httpx.AsyncClient, plan: BurstPlan, rng: random.Random) -> BurstResult:
    result = BurstResult()
    hang_ups = set(rng.sample(range(plan.streams), plan.disconnects))
    shortest = min(8, plan.max_tokens)
    jobs = [_stream(client, plan, i, rng.randint(1, 8) if i in hang_ups else None,
                    rng.randint(shortest, plan.max_tokens), result) for i in range(plan.streams)]
    jobs += [_bad(client, *BAD_BODIES[(i + rng.randrange(len(BAD_BODIES))) % len(BAD_BODIES)], result)
             for i in range(plan.bad_requests)]
    rng.shuffle(jobs)
    await asyncio.gather(*jobs)
    return result


async def _stream(client: httpx.AsyncClient, plan: BurstPlan, i: int, hang_up_after: int | None,
                  max_tokens: int, result: BurstResult) -> None:
    body = {"model": plan.model, "stream": True, "max_tokens": max_tokens, "temperature": 0.8, "seed": i,
            "messages": [{"role": "system", "content": "You are a concise assistant."},
                         {"role": "user", "content": f"Tell me fact number {i} about paged memory."}]}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                result.errors.append(f"stream {i}: HTTP {response.status_code}")
                return
            await _read_stream(response, i, hang_up_after, result)
    except httpx.HTTPError as exc:
        result.errors.append(f"stream {i}: {type(exc).__name__}: {exc}")


async def _read_stream(response: httpx.Response, i: int, hang_up_after: int | None, result: BurstResult) -> None:
    events = 0
    async for line in sse_lines(response):
        if not line.startswith("data: "):
            continue
        events += 1
        if line == "data: [DONE]":
            result.completed += 1
            return
        if hang_up_after is not None and events >= hang_up_after:
            result.disconnected += 1
            return  # leaving the block closes the connection mid-stream
    result.errors.append(f"stream {i}: ended after {events} events without [DONE]")


async def _bad(client: httpx.AsyncClient, path: str, raw: bytes, result: BurstResult) -> None:
    try:
        response = await client.post(path, content=raw, headers={"content-type": "application/json"})
    except httpx.HTTPError as exc:
        result.errors.append(f"bad request to {path}: {type(exc).__name__}")
        return
    if not 400 <= response.status_code < 500 or not _is_error_json(response.text):
        result.errors.append(f"bad request to {path}: HTTP {response.status_code} {response.text[:120]}")
    else:
        result.refused += 1


def _is_error_json(text: str) -> bool:
    try:
        error = json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and isinstance(error.get("message"), str)
