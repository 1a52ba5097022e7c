"""Reasoning parsers (`--reasoning-parser`, as in vLLM): a thinking model's answer split into its reasoning and its
content, whole or as a stream goes.

The reasoning is the text between `<think>` and `</think>`. It is open at the start of the answer where the
answer begins with `<think>` (after whitespace), or where the parser says so: `deepseek_r1` always (its template
opens the block in the prompt; an answer without `</think>` is all reasoning), `qwen3` where the prompt itself ends
with an open `<think>` (Qwen3's thinking templates; with `enable_thinking` false the template closes it, and the
answer is all content). Where the reasoning is not open, the whole answer is content.
"""

from __future__ import annotations

from pagedllm.config import REASONING_PARSERS
from pagedllm.engine.thinking_budget import THINK_END as END
from pagedllm.engine.thinking_budget import THINK_START as START
from pagedllm.entrypoints.text_tags import partial_tag_overlap


def opens_in_reasoning(parser: str, prompt_tail: str) -> bool:
    """Whether an answer to a prompt ending with `prompt_tail` begins inside the reasoning block."""
    if parser not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {parser!r}")
    return parser == "deepseek_r1" or prompt_tail.rstrip().endswith(START)


def think_token_ids(vocab: dict[str, int]) -> tuple[int, int] | None:
    """The ids of `<think>` and `</think>` where each is one token of the vocabulary (as in Qwen3's and DeepSeek
    R1's), else None."""
    start, end = vocab.get(START), vocab.get(END)
    return None if start is None or end is None else (start, end)


def count_reasoning_tokens(token_ids: list[int], tags: tuple[int, int], opened: bool) -> int:
    """The answer's tokens inside its reasoning, the tags left out: up to the first `</think>` where the reasoning
    is open at the start (opened, or the answer's first token is `<think>`), else none."""
    start, end = tags
    leading_tag = bool(token_ids) and token_ids[0] == start
    if not (opened or leading_tag):
        return 0
    inside = token_ids[1:] if leading_tag else token_ids
    return inside.index(end) if end in inside else len(inside)


def split_reasoning(text: str, opened: bool) -> tuple[str | None, str | None]:
    """(reasoning, content) of a whole answer; None for a part that is empty."""
    stream = ReasoningStream(opened)
    reasoning, content = stream.feed(text, ended=True)
    return reasoning or None, content or None


class ReasoningStream:
    """One choice's text as it grows in; out: the reasoning and the content it adds. Text that may yet be a tag
    waits for the next piece."""

    def __init__(self, opened: bool) -> None:
        self.state = "start"  # "start": a leading <think> may yet come; then "reasoning", then "content"
        self.opened = opened
        self.pending = ""  # text not yet sent

    def feed(self, text: str, ended: bool) -> tuple[str, str]:
        self.pending += text
        reasoning = content = ""
        if self.state == "start":
            self._start(ended)
        if self.state == "reasoning":
            reasoning = self._reasoning(ended)
        if self.state == "content":
            content, self.pending = self.pending, ""
        return reasoning, content

    def _start(self, ended: bool) -> None:
        head = self.pending.lstrip()
        if head.startswith(START):
            self.pending, self.state = head[len(START):], "reasoning"
        elif ended or not START.startswith(head):  # no leading <think> can come any more
            self.state = "reasoning" if self.opened else "content"

    def _reasoning(self, ended: bool) -> str:
        before, tag, after = self.pending.partition(END)
        if tag:
            self.pending, self.state = after, "content"
            return before
        keep = 0 if ended else partial_tag_overlap(self.pending, END)
        sent, self.pending = self.pending[:len(self.pending) - keep], self.pending[len(self.pending) - keep:]
        return sent
