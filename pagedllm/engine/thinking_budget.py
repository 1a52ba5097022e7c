"""Thinking token budgets (`SamplingParams.thinking_token_budget`, as vLLM's): a thinking model's reasoning cut
after a number of tokens by forcing its end.

A sequence reasons between the start tokens (`<think>`) and the end tokens (`</think>`), as the engine's reasoning
parser or reasoning config names them (ThinkTags). The reasoning may be open in the prompt (its last start comes
after its last end: a thinking template leaves it open, and the tokens after the start count) or open in the
output; each block gets the whole budget. Once a block holds `budget` tokens, the next tokens are forced, one a
step, to the forced end's (reasoning_config's `reasoning_end_str`, the end tag by default); then the model goes on
with its answer. A model may end its reasoning earlier itself. Forced tokens are output tokens like any other
(max_tokens counts them; their logprobs are the model's own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedllm.config import reasoning_strings
from pagedllm.errors import InvalidInputError

THINK_START, THINK_END = "<think>", "</think>"  # the tags of every reasoning parser here (qwen3, deepseek_r1)
THINKING_NEEDS_TAGS = ("thinking_token_budget needs the reasoning tags: start the engine with a reasoning parser "
                       "(--reasoning-parser / reasoning_parser=) or a reasoning config giving both "
                       "reasoning_start_str and reasoning_end_str (--reasoning-config)")


@dataclass(frozen=True, slots=True)
class ThinkTags:
    start: tuple[int, ...]  # the tokens that open a reasoning block
    end: tuple[int, ...]  # the tokens that close one (the model's own end)
    forced_end: tuple[int, ...]  # the tokens written when a block runs out of budget


def think_tags(reasoning_parser: str | None, reasoning_config: str | dict | None, tokenizer: Any,
               vocab_size: int) -> ThinkTags | None:
    """The tags as token ids: a reasoning parser's `<think>` / `</think>`, each overridden by the config's string
    where it gives one (the forced end only: the model's own end stays the parser's tag). Without a parser the
    config must give both strings. None where there is nothing to go by (no budget can be held)."""
    strings = reasoning_strings(reasoning_config)
    start = strings.get("reasoning_start_str", THINK_START if reasoning_parser else None)
    forced_end = strings.get("reasoning_end_str", THINK_END if reasoning_parser else None)
    if start is None or forced_end is None:
        return None
    end = THINK_END if reasoning_parser else forced_end
    return ThinkTags(*(_token_ids(tokenizer, text, vocab_size) for text in (start, end, forced_end)))


def _token_ids(tokenizer: Any, text: str, vocab_size: int) -> tuple[int, ...]:
    ids = tuple(tokenizer.encode(text, add_special_tokens=False))
    if not ids or max(ids) >= vocab_size:
        raise InvalidInputError(f"reasoning tag {text!r} tokenizes to {list(ids)}: not tokens of the model's "
                                f"vocabulary of {vocab_size}")
    return ids


class ThinkingBudget:
    """One sequence's place in its reasoning. Given its output so far, it says which token the next step must
    write (None: the model's own choice)."""

    def __init__(self, tags: ThinkTags, budget: int, prompt_ids: list[int]) -> None:
        self.tags, self.budget = tags, budget
        self._window = max(len(tags.start), len(tags.end))
        self._recent = list(prompt_ids[-self._window:])  # the last tokens, where a tag is looked for
        start, end = _last_index(prompt_ids, tags.start), _last_index(prompt_ids, tags.end)
        # tokens in the open block so far; None: outside any block
        self._count = len(prompt_ids) - start - len(tags.start) if start > end else None
        self._forced = 0  # forced end tokens written so far
        self._seen = 0  # output tokens taken in

    def forced_token(self, output_ids: list[int]) -> int | None:
        for token in output_ids[self._seen:]:
            self._take(token)
        self._seen = len(output_ids)
        if self._count is None or self._count < self.budget:
            return None
        return self.tags.forced_end[self._forced]

    def _take(self, token: int) -> None:
        self._recent = (self._recent + [token])[-self._window:]
        if self._count is None:
            if _ends_with(self._recent, self.tags.start):
                self._count = 0
        elif self._count >= self.budget:  # the token was forced
            self._forced += 1
            if self._forced == len(self.tags.forced_end):
                self._count, self._forced = None, 0
        elif _ends_with(self._recent, self.tags.end):
            self._count = None
        else:
            self._count += 1


def _ends_with(ids: list[int], tail: tuple[int, ...]) -> bool:
    return len(ids) >= len(tail) and tuple(ids[len(ids) - len(tail):]) == tail


def _last_index(ids: list[int], tag: tuple[int, ...]) -> int:
    """Where the last occurrence of `tag` begins in `ids`, -1 where it does not occur."""
    first = tag[0]
    for i in range(len(ids) - len(tag), -1, -1):
        if ids[i] == first and tuple(ids[i:i + len(tag)]) == tag:
            return i
    return -1
