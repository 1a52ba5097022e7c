"""The soak's `--mix features` requests: each drawn across the three generating endpoints and what they take
(n, logprobs, stops, penalties, structured outputs, tool calls, beam search, prompt logprobs, token ids, stream
intervals, shared request ids, the Responses API and its function calls, stored responses continued and background
ones polled to their end), streamed or whole, so that a burst runs them all at once under preemption.

Every body fits the soak's small pool (prompts of at most about 60 tokens, n and beams of at most 2), so a
healthy server answers each with a 200.
"""

from __future__ import annotations

import random
from typing import Any

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# A response body's mark (never sent) that has the burst continue a stored response done before it, where one is
# (previous_response_id); the server keeps responses (--responses-store-size) for the features mix.
CONTINUES = "soak_continues"
STORE_ARGS = ["--responses-store-size", "64"]


def feature_request(rng: random.Random, i: int, max_tokens: int, model: str) -> tuple[str, dict[str, Any]]:
    """(path, body) of request `i`: a chat (half), a completion or a response."""
    draw = rng.random()
    make = _chat if draw < 0.5 else _completion if draw < 0.8 else _response
    path, body = make(rng, i)
    limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    return path, {"model": model, limit: rng.randint(1, max_tokens), **body}


def _chat(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": f"Fact {i} about paged memory, please."}],
                            "seed": i, "stream": rng.random() < 0.5}
    if rng.random() < 0.1:
        return "/v1/chat/completions", {**body, "use_beam_search": True, "n": 2}
    named = {"type": "function", "function": {"name": "get_weather"}}
    body.update(rng.choice([{}, {"response_format": {"type": "json_schema", "json_schema": {"name": "p",
                                                                                             "schema": SCHEMA}}},
                            {"structured_outputs": {"choice": ["yes", "no"]}},
                            {"tools": [TOOL], "tool_choice": "required"}, {"tools": [TOOL], "tool_choice": named}]))
    _sampling(rng, body)
    if rng.random() < 0.3:
        body.update(logprobs=True, top_logprobs=rng.randint(0, 3))
        if rng.random() < 0.3:  # vLLM's: these tokens' logprobs instead of the top-k
            body["logprob_token_ids"] = [rng.randrange(256) for _ in range(rng.randint(1, 4))]  # in any test vocabulary
    if not body["stream"] and rng.random() < 0.2:
        body["prompt_logprobs"] = rng.randint(0, 2)
    return "/v1/chat/completions", body


def _completion(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"prompt": f"Story {i}: once upon a time", "seed": i, "stream": rng.random() < 0.5}
    if not body["stream"] and rng.random() < 0.15:
        return "/v1/completions", {**body, "use_beam_search": True, "n": 2}
    _sampling(rng, body)
    if rng.random() < 0.3:
        body.update(logprobs=rng.randint(0, 3), echo=not body["stream"] and rng.random() < 0.5)
    if rng.random() < 0.2:
        body["return_token_ids"] = True
    return "/v1/completions", body


def _response(rng: random.Random, i: int) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {"input": f"Question {i}: what is a block table?", "stream": rng.random() < 0.5}
    if rng.random() < 0.3:
        body["instructions"] = "Answer in one sentence."
    if rng.random() < 0.2:
        body.update(include=["message.output_text.logprobs"], top_logprobs=rng.randint(0, 2))
    kept = rng.random()
    if kept < 0.15 and not body["stream"]:
        body["background"] = True  # answered at once (queued): the burst polls it to its end
    elif kept < 0.3:
        body[CONTINUES] = True
    draw = rng.random()
    if draw < 0.2:
        body["text"] = {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}
    elif draw < 0.4:  # the Responses API's flat function tool
        body.update(tools=[{"type": "function", **TOOL["function"]}], tool_choice="required")
    return "/v1/responses", body


def _sampling(rng: random.Random, body: dict[str, Any]) -> None:
    """Sampling fields both token endpoints take: n, temperature, stops, penalties; vLLM's stream_interval,
    repetition_detection and request_id (a few ids shared, so that requests running together share one)."""
    body["n"] = rng.randint(1, 2)
    if body["stream"] and rng.random() < 0.3:
        body["stream_interval"] = rng.randint(2, 4)
    if rng.random() < 0.2:
        body["request_id"] = f"soak-{rng.randint(0, 3)}"
    body["temperature"] = rng.choice([0.0, 0.7, 1.2])
    if rng.random() < 0.2:
        body["stop"] = rng.choice([".", ["a", "the"]])
    if rng.random() < 0.15:
        body.update(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.1)
    if rng.random() < 0.15:
        body["repetition_detection"] = {"max_pattern_size": rng.randint(1, 8), "min_count": rng.randint(2, 3)}
