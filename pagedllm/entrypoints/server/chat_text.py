"""A chat choice's text as its message, whole or streamed: a thinking model's reasoning split off first (with a
reasoning parser), then the tool calls found in the rest (with tools), the rest the content."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedllm.entrypoints.reasoning import ReasoningStream, count_reasoning_tokens, split_reasoning
from pagedllm.entrypoints.tool_calls import ToolCallStream, ToolChoice, parse_message


@dataclass(frozen=True, slots=True)
class ChatText:
    tools: ToolChoice | None = None  # None (or "none"): no calls are looked for
    reasoning_opened: bool | None = None  # None: no reasoning parser; else whether the answer begins in reasoning
    include_reasoning: bool = True  # the request's include_reasoning
    echo: str = ""  # what each message's content begins with (vLLM's echo)
    think_ids: tuple[int, int] | None = None  # <think> and </think> where each is one token: reasoning is counted

    @property
    def calls_tools(self) -> bool:
        return self.tools is not None and self.tools.mode != "none"

    def message(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        """{"message": ..., "finish_reason": ...} of a whole choice."""
        reasoning, content = self.split(text)
        calls = []
        if self.calls_tools:
            parsed = parse_message(self.tools, content or "")
            content, calls = parsed.content, parsed.tool_calls
            finish_reason = parsed.finish_reason(self.tools, finish_reason)
        message: dict[str, Any] = {"role": "assistant", "content": _echoed(self.echo, content)}
        if self.reasoning_opened is not None:
            message["reasoning"] = reasoning if self.include_reasoning else None
        if calls:
            message["tool_calls"] = [call.to_json() for call in calls]
        return {"message": message, "finish_reason": finish_reason}

    def usage_details(self, outputs: list[list[int]]) -> dict[str, Any] | None:
        """usage's completion_tokens_details over the choices' token ids: the reasoning's tokens, as vLLM counts them
        (with a reasoning parser, where the tags are tokens of their own)."""
        if self.reasoning_opened is None or self.think_ids is None:
            return None
        counted = sum(count_reasoning_tokens(ids, self.think_ids, self.reasoning_opened) for ids in outputs)
        return {"reasoning_tokens": counted}

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content); without a reasoning parser the text is the content."""
        if self.reasoning_opened is None:
            return None, text
        return split_reasoning(text, self.reasoning_opened)


class ChoiceStream:
    """One streamed choice: its text as it grows in; out, the deltas to send (reasoning, content, tool calls)."""

    def __init__(self, chat: ChatText) -> None:
        self.include_reasoning = chat.include_reasoning
        self.reasoning = ReasoningStream(chat.reasoning_opened) if chat.reasoning_opened is not None else None
        self.tools = ToolCallStream(chat.tools) if chat.calls_tools else None

    def feed(self, text: str, ended: bool) -> list[dict[str, Any]]:
        reasoning, content = self.reasoning.feed(text, ended) if self.reasoning is not None else ("", text)
        calls: list[dict[str, Any]] = []
        if self.tools is not None:
            content, calls = self.tools.feed(content, ended)
        deltas = [{"reasoning": reasoning}] if reasoning and self.include_reasoning else []
        return deltas + ([{"content": content}] if content else []) + ([{"tool_calls": calls}] if calls else [])

    def finish_reason(self, reason: str | None) -> str | None:
        return self.tools.finish_reason(reason) if self.tools is not None else reason


def _echoed(echo: str, content: str | None) -> str | None:
    return echo + content if content is not None else (echo or None)
