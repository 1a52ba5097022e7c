"""Logprobs in the two OpenAI shapes: legacy completions and chat."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from pagedllm.engine.outputs import TokenLogprob
from pagedllm.engine.token_text import TokenText


def finite(logprob: float) -> float:
    """JSON has no -inf; a token the sampler could never pick gets a very low finite value."""
    return max(float(logprob), -9999.0)


def completion_logprobs(entries: list[TokenLogprob], text_of: TokenText | TokenIdText, offset: int) -> dict[str, Any]:
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


def prompt_logprobs(prompt_ids: list[int], entries: list[TokenLogprob | None],
                    text_of: TokenText | TokenIdText) -> dict[str, Any]:
    """The echoed prompt's part of a /v1/completions logprobs object: its first token has no logprob (None)."""
    tokens = [text_of(t) for t in prompt_ids]
    return {
        "tokens": tokens,
        "token_logprobs": [None] + [finite(e.logprob) for e in entries[1:]],
        "top_logprobs": [None] + [_top_with_sampled(e, text_of) for e in entries[1:]],
        "text_offset": list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else [],
    }


def token_first(entries: list[TokenLogprob]) -> list[TokenLogprob]:
    """Entries of logprob_token_ids as vLLM gives them: the token itself first among the alternatives, then the
    named tokens in their order (each once)."""
    return [replace(e, top={e.token_id: e.logprob, **{t: lp for t, lp in e.top.items() if t != e.token_id}})
            for e in entries]


def _top_with_sampled(entry: TokenLogprob, text_of: TokenText | TokenIdText) -> dict[str, float]:
    """The k alternatives and, where it is not among them, the sampled token (so up to k + 1, as OpenAI's
    legacy completions return them)."""
    top: dict[str, float] = {}
    for token, logprob in entry.top.items():  # best first: of tokens that read the same, the likeliest stays
        top.setdefault(text_of(token), finite(logprob))
    if entry.token_id not in entry.top:
        top.setdefault(text_of(entry.token_id), finite(entry.logprob))
    return top


def chat_logprobs(entries: list[TokenLogprob], text_of: TokenText | TokenIdText) -> dict[str, Any]:
    """{"content": [{"token", "logprob", "bytes", "top_logprobs"}]} as /v1/chat/completions returns."""
    return {"content": chat_logprob_entries(entries, text_of), "refusal": None}


def chat_logprob_entries(entries: list[TokenLogprob], text_of: TokenText | TokenIdText) -> list[dict[str, Any]]:
    """Per token {"token", "logprob", "bytes", "top_logprobs"}: chat's logprobs.content, a response's output_text's."""
    return [_chat_entry(e, text_of) for e in entries]


def delta_logprob_entries(entries: list[TokenLogprob], text_of: TokenText) -> list[dict[str, Any]]:
    """Per token {"token", "logprob", "top_logprobs": [{"token", "logprob"}]}: the Responses API's output_text
    events name no bytes."""
    return [{"token": text_of(e.token_id), "logprob": finite(e.logprob),
             "top_logprobs": [{"token": text_of(t), "logprob": finite(lp)} for t, lp in e.top.items()]}
            for e in entries]


def _chat_entry(entry: TokenLogprob, text_of: TokenText | TokenIdText) -> dict[str, Any]:
    item = _token(entry.token_id, entry.logprob, text_of)
    item["top_logprobs"] = [_token(t, lp, text_of) for t, lp in entry.top.items()]
    return item


def _token(token_id: int, logprob: float, text_of: TokenText | TokenIdText) -> dict[str, Any]:
    return {"token": text_of(token_id), "logprob": finite(logprob), "bytes": text_of.bytes_of(token_id)}


def vllm_prompt_logprobs(entries: list[TokenLogprob | None], text_of: TokenText) -> list[dict[str, Any] | None]:
    """vLLM's prompt_logprobs field: per prompt token, None for the first (nothing comes before it), then
    {"<id>": {"logprob", "rank", "decoded_token"}} for the token itself and its top-k alternatives."""
    return [None if entry is None else {str(token): {"logprob": finite(logprob.logprob), "rank": logprob.rank,
                                                     "decoded_token": text_of(token)}
                                        for token, logprob in entry.items()}
            for entry in entries]


class TokenIdText:
    """Logprobs' token names as vLLM's return_tokens_as_token_ids writes them, "token_id:<id>" (which a text that
    does not decode alone cannot garble); `bytes` stay the token's own."""

    def __init__(self, text_of: TokenText) -> None:
        self._text_of = text_of

    def __call__(self, token_id: int) -> str:
        return f"token_id:{token_id}"

    def bytes_of(self, token_id: int) -> list[int]:
        return self._text_of.bytes_of(token_id)
