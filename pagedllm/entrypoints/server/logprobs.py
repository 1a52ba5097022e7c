"""Logprobs in the two OpenAI shapes: legacy completions and chat."""

from __future__ import annotations

import functools
import itertools
import re
from typing import Any

from pagedllm.engine.outputs import TokenLogprob


def finite(logprob: float) -> float:
    """JSON has no -inf; a token the sampler could never pick gets a very low finite value."""
    return max(float(logprob), -9999.0)


class TokenText:
    """Token id -> its text, with a small cache (the same ids recur across top-k lists)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            if len(self._cache) < 65536:
                self._cache[token_id] = text
        return text

    def bytes_of(self, token_id: int) -> list[int]:
        """The token's own bytes (OpenAI's `bytes`, for joining characters split across tokens): its text's where
        it reads whole, else its vocabulary piece's (a <0xNN> byte token, or a byte-level BPE piece's)."""
        text = self(token_id)
        if "\ufffd" not in text:
            return list(text.encode("utf-8"))
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if match := re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece or ""):
            return [int(match.group(1), 16)]
        decoder = _byte_level_decoder()
        if piece and all(char in decoder for char in piece):
            return [decoder[char] for char in piece]
        return list(text.encode("utf-8"))


@functools.cache
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet -> the byte each character stands for (printable bytes stand for
    themselves, the others for the characters from U+0100 on)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


def completion_logprobs(entries: list[TokenLogprob], text_of: TokenText, offset: int) -> dict[str, Any]:
    """{"tokens", "token_logprobs", "top_logprobs", "text_offset"} as /v1/completions returns."""
    tokens = [text_of(e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [finite(e.logprob) for e in entries],
        "top_logprobs": [_top_with_sampled(e, text_of) for e in entries],
        "text_offset": offsets,
    }


def prompt_logprobs(prompt_ids: list[int], entries: list[TokenLogprob | None], text_of: TokenText) -> dict[str, Any]:
    """The echoed prompt's part of a /v1/completions logprobs object: its first token has no logprob (None)."""
    tokens = [text_of(t) for t in prompt_ids]
    return {
        "tokens": tokens,
        "token_logprobs": [None] + [finite(e.logprob) for e in entries[1:]],
        "top_logprobs": [None] + [_top_with_sampled(e, text_of) for e in entries[1:]],
        "text_offset": list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else [],
    }


def _top_with_sampled(entry: TokenLogprob, text_of: TokenText) -> dict[str, float]:
    """The k alternatives and, where it is not among them, the sampled token (so up to k + 1, as OpenAI's
    legacy completions return them)."""
    top: dict[str, float] = {}
    for token, logprob in entry.top.items():  # best first: of tokens that read the same, the likeliest stays
        top.setdefault(text_of(token), finite(logprob))
    if entry.token_id not in entry.top:
        top.setdefault(text_of(entry.token_id), finite(entry.logprob))
    return top


def chat_logprobs(entries: list[TokenLogprob], text_of: TokenText) -> dict[str, Any]:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs"}]} as /v1/chat/completions returns."""
    return {"content": [_chat_entry(e, text_of) for e in entries], "refusal": None}


def _chat_entry(entry: TokenLogprob, text_of: TokenText) -> dict[str, Any]:
    item = _token(entry.token_id, entry.logprob, text_of)
    item["top_logprobs"] = [_token(t, lp, text_of) for t, lp in entry.top.items()]
    return item


def _token(token_id: int, logprob: float, text_of: TokenText) -> dict[str, Any]:
    return {"token": text_of(token_id), "logprob": finite(logprob), "bytes": text_of.bytes_of(token_id)}
