"""One soak burst: concurrent streaming chats, some hanging up mid-stream, with bad requests mixed in.

Counts what a healthy server must never do: a 5xx, a stream that ends without [DONE], a bad
request answered anything but a 4xx with OpenAI's error JSON.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field

import httpx

from pagedllm.bench.soak_features import CONTINUES, feature_request
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
    stored: list[str] = field(default_factory=list)  # ids of finished responses the server keeps, to continue


@dataclass(slots=True)
class BurstPlan:
    streams: int  # requests per burst (all streamed chats with mix "chat")
    disconnects: int  # of those, how many hang up mid-stream (a request of the features mix not streamed: none)
    bad_requests: int
    max_tokens: int
    model: str
    mix: str = "chat"  # "chat": streamed chats; "features": soak_features.feature_request's mix


async def run_burst(client: httpx.AsyncClient, plan: BurstPlan, rng: random.Random) -> BurstResult:
    result = BurstResult()
    hang_ups = set(rng.sample(range(plan.streams), plan.disconnects))
    jobs = [_request(client, *_body(plan, i, rng), i, rng.randint(1, 8) if i in hang_ups else None, result)
            for i in range(plan.streams)]
    jobs += [_bad(client, *BAD_BODIES[(i + rng.randrange(len(BAD_BODIES))) % len(BAD_BODIES)], result)
             for i in range(plan.bad_requests)]
    rng.shuffle(jobs)
    await asyncio.gather(*jobs)
    return result


def _body(plan: BurstPlan, i: int, rng: random.Random) -> tuple[str, dict]:
    if plan.mix == "features":
        return feature_request(rng, i, plan.max_tokens, plan.model)
    body = {"model": plan.model, "stream": True, "max_tokens": rng.randint(min(8, plan.max_tokens), plan.max_tokens),
            "temperature": 0.8, "seed": i,
            "messages": [{"role": "system", "content": "You are a concise assistant."},
                         {"role": "user", "content": f"Tell me fact number {i} about paged memory."}]}
    return "/v1/chat/completions", body


POLL_SECONDS = 120.0  # longest a background response may take to finish
CONTINUE_WAIT = 10.0  # longest a continuation waits for a stored response to continue (else it starts afresh)


async def _request(client: httpx.AsyncClient, path: str, body: dict, i: int, hang_up_after: int | None,
                   result: BurstResult) -> None:
    continues = body.pop(CONTINUES, False)
    if continues and (previous := await _stored_response(result, i)) is not None:
        body["previous_response_id"] = previous
    try:
        if not body.get("stream"):
            response = await client.post(path, json=body)
            answer = response.json() if response.status_code == 200 else {}
            if answer.get("status") == "queued":  # a background response: polled until it ends
                answer = await _poll(client, answer["id"], i, result)
                if not answer:
                    return
            if response.status_code != 200 or not ({"choices", "output"} & set(answer)):
                result.errors.append(f"request {i} to {path}: HTTP {response.status_code} {response.text[:120]}")
            else:
                result.completed += 1
                if answer.get("store") and not continues:  # a continuation is not continued again: prompts stay short
                    result.stored.append(answer["id"])
            return
        async with client.stream("POST", path, json=body) as response:
            if response.status_code != 200:
                body_text = (await response.aread()).decode(errors="replace")[:120]
                result.errors.append(f"stream {i} to {path}: HTTP {response.status_code} {body_text}")
                return
            await _read_stream(response, i, hang_up_after, result)
    except httpx.HTTPError as exc:
        result.errors.append(f"request {i} to {path}: {type(exc).__name__}: {exc}")


async def _stored_response(result: BurstResult, i: int) -> str | None:
    """A finished response of this burst that the server keeps, once there is one (the burst starts every request
    at once); None after CONTINUE_WAIT without one."""
    deadline = time.monotonic() + CONTINUE_WAIT
    while not result.stored and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return result.stored[i % len(result.stored)] if result.stored else None


async def _poll(client: httpx.AsyncClient, response_id: str, i: int, result: BurstResult) -> dict:
    """The background response once it has ended (completed or incomplete); {} (with the error counted) where it
    failed, was cancelled or took past POLL_SECONDS."""
    deadline = time.monotonic() + POLL_SECONDS
    while time.monotonic() < deadline:
        got = await client.get(f"/v1/responses/{response_id}")
        answer = got.json() if got.status_code == 200 else {"status": f"HTTP {got.status_code}"}
        if answer["status"] in ("completed", "incomplete"):
            return answer
        if answer["status"] not in ("queued", "in_progress"):
            result.errors.append(f"background response {i}: {answer['status']} {got.text[:120]}")
            return {}
        await asyncio.sleep(0.05)
    result.errors.append(f"background response {i}: not done after {POLL_SECONDS:.0f} s")
    return {}


async def _read_stream(response: httpx.Response, i: int, hang_up_after: int | None, result: BurstResult) -> None:
    events = 0
    async for line in sse_lines(response):
        if not line.startswith("data: "):
            continue
        events += 1
        event = {} if line == "data: [DONE]" else json.loads(line[len("data: "):])
        if line == "data: [DONE]" or event.get("type") == "response.completed":  # a chat's or a response's end
            result.completed += 1
            return
        if "error" in event or event.get("type") == "error":
            result.errors.append(f"stream {i}: {line[:160]}")
            return
        if hang_up_after is not None and events >= hang_up_after:
            result.disconnected += 1
            return  # leaving the block closes the connection mid-stream
    result.errors.append(f"stream {i}: ended after {events} events without its end ([DONE], response.completed)")


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
