"""A chat choice's text as its message: content and tool calls, whole (parse_message) or as a stream goes
(ToolCallStream), and the finish reason that goes with them.

A stream sends what the whole answer gives, in pieces: a named function's arguments as they are generated; under
"auto" the content before the first call as it comes; every other call once the answer has ended, so that a
stream's calls and content are always the non-streamed answer's.
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

from pagedllm.entrypoints.tool_calls.choice import ToolChoice
from pagedllm.entrypoints.tool_calls.parsers import TOOL_CALL_PARSERS

_ALPHANUMERIC = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{secrets.token_hex(8)}")

    @classmethod
    def made(cls, choice: ToolChoice, name: str, arguments: str) -> "ToolCall":
        """A call with an id of the form the parser's models need (Mistral's templates take 9 letters and digits
        only), else vLLM's."""
        if choice.parser == "mistral":
            return cls(name, arguments, "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9)))
        return cls(name, arguments)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def delta(self, index: int) -> dict[str, Any]:
        """The whole call as one streamed tool_calls entry."""
        return {"index": index, **self.to_json()}


@dataclass(slots=True)
class ParsedMessage:
    content: str | None
    tool_calls: list[ToolCall]

    def finish_reason(self, choice: ToolChoice, reason: str | None) -> str | None:
        """OpenAI's: "tool_calls" where "auto" found calls or "required" ended whole; a named call keeps "stop"."""
        if self.tool_calls and (choice.mode == "auto" or (choice.mode == "required" and reason == "stop")):
            return "tool_calls"
        return reason


def parse_message(choice: ToolChoice, text: str) -> ParsedMessage:
    if choice.mode == "named":
        return ParsedMessage("", [ToolCall.made(choice, choice.function, text)] if text.strip() else [])
    if choice.mode == "required":
        return ParsedMessage("", _listed_calls(choice, text))
    if choice.mode == "auto":
        found = TOOL_CALL_PARSERS[choice.parser]().parse(text)
        if found is not None:
            content, calls = found
            calls = [ToolCall.made(choice, c.name, json.dumps(c.arguments, ensure_ascii=False)) for c in calls]
            return ParsedMessage(content, calls if choice.parallel else calls[:1])
    return ParsedMessage(text, [])


def _listed_calls(choice: ToolChoice, text: str) -> list[ToolCall]:
    """The calls of a "required" answer, a JSON list of {"name", "parameters"}; none where it was cut short."""
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return []
    if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                              and "parameters" in c for c in calls):
        return []
    return [ToolCall.made(choice, c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]


class ToolCallStream:
    """One streamed choice: its text as it grows in; the content to send and the tool_calls entries out."""

    def __init__(self, choice: ToolChoice) -> None:
        self.choice = choice
        self.text = ""
        self.sent = 0  # characters of text already sent (as content, or as a named call's arguments)
        self.calling = False  # auto: a call has begun, the rest waits for the end
        self.named_started = False
        self.parser = TOOL_CALL_PARSERS[choice.parser]() if choice.mode == "auto" else None
        self.parsed: ParsedMessage | None = None  # once the answer has ended

    def feed(self, text: str, ended: bool) -> tuple[str, list[dict[str, Any]]]:
        self.text += text
        if self.choice.mode == "named":
            return "", self._named_arguments(ended)
        content = self._auto_content() if self.choice.mode == "auto" and not self.calling else ""
        if not ended:
            return content, []
        self.parsed = parse_message(self.choice, self.text)
        if self.choice.mode == "auto" and not self.parsed.tool_calls:  # no call parsed: it was all content
            return content + self.text[self.sent:], []
        return content, [call.delta(i) for i, call in enumerate(self.parsed.tool_calls)]

    def finish_reason(self, reason: str | None) -> str | None:
        return self.parsed.finish_reason(self.choice, reason) if self.parsed is not None else reason

    def _named_arguments(self, ended: bool) -> list[dict[str, Any]]:
        if ended:
            self.parsed = parse_message(self.choice, self.text)
        if not self.text[self.sent:] or not self.text.strip():  # a call begins with its first visible character
            return []
        new, self.sent = self.text[self.sent:], len(self.text)
        if not self.named_started:
            self.named_started = True
            return [ToolCall.made(self.choice, self.choice.function, new).delta(0)]
        return [{"index": 0, "function": {"arguments": new}}]

    def _auto_content(self) -> str:
        # only the unsent text is looked at: what was sent holds no call, nor the beginning of one
        tail = self.text[self.sent:]
        end, self.calling = self.parser.content_end(tail)
        self.sent += end
        return tail[:end]
