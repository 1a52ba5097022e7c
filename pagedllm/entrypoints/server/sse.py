"""Server-sent events framing for the streaming endpoints."""

from __future__ import annotations

import json
from typing import Any

from pagedllm.entrypoints.protocol import StreamOptions

DONE = "data: [DONE]\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Line ends to Python's str.splitlines (and so to httpx's iter_lines) that JSON leaves unescaped: a model's text
# holding one would split the event's line for such clients. Escaped, the JSON reads the same.
_SPLITLINES_ESCAPES = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    if not text.isascii():
        text = text.translate(_SPLITLINES_ESCAPES)
    return f"data: {text}\n\n"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with `cached_tokens` (vLLM's --enable-prompt-tokens-details) the prompt tokens the prefix cache
    served, as prompt_tokens_details."""
    counts: dict[str, Any] = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                              "total_tokens": prompt_tokens + completion_tokens}
    if cached_tokens is not None:
        counts["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return counts


class ChunkUsage:
    """The "usage" field of a stream's chunks: absent unless stream_options.include_usage; then null, or with
    continuous_usage_stats (as vLLM has it) the chunk's prompt tokens and its choice's completion tokens so far."""

    def __init__(self, options: StreamOptions | None, prompt_lengths: list[int]) -> None:
        self.include = options is not None and options.include_usage
        self.continuous = self.include and options is not None and options.continuous_usage_stats
        self.prompt_lengths = prompt_lengths
        self._sent: dict[int, int] = {}  # choice index -> its tokens sent so far

    def stamp(self, chunk: dict[str, Any], prompt_index: int, choice_index: int, new_tokens: int = 0) -> dict[str, Any]:
        if self.include:
            sent = self._sent[choice_index] = self._sent.get(choice_index, 0) + new_tokens
            chunk["usage"] = usage(self.prompt_lengths[prompt_index], sent) if self.continuous else None
        return chunk
