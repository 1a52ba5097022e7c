"""Tool-call parsers: where a model's own text holds tool calls, in the format its chat template taught it
(`--tool-call-parser`, as in vLLM).

`hermes` (Hermes 2 Pro and later, Qwen2.5, Qwen3 and other templates of that format): each call is a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`; the text before the first
`<tool_call>` is the answer's content. A call cut short by the end of the answer is read up to that end. Where any
call does not parse, the whole text is the content and there are no calls (as vLLM reads it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FoundCall:
    name: str
    arguments: Any  # the JSON value the model gave


class HermesParser:
    start, end = "<tool_call>", "</tool_call>"
    _blocks = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)

    def parse(self, text: str) -> tuple[str | None, list[FoundCall]] | None:
        """(content before the calls or None, the calls); None where the text holds no call that parses."""
        if self.start not in text:
            return None
        calls = []
        for closed, open_ended in self._blocks.findall(text):
            try:
                call = json.loads(closed or open_ended)
            except json.JSONDecodeError:
                return None
            if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
                return None
            calls.append(FoundCall(call["name"], call["arguments"]))
        content = text[: text.index(self.start)]
        return content or None, calls

    def content_end(self, text: str) -> tuple[int, bool]:
        """How much of a growing text is content for certain, and whether a call has begun: up to the first
        `<tool_call>`, else all but an ending that may yet become one."""
        if self.start in text:
            return text.index(self.start), True
        return len(text) - _partial_overlap(text, self.start), False


def _partial_overlap(text: str, tag: str) -> int:
    """The length of the longest ending of `text` that begins `tag` (and is shorter than it)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


TOOL_CALL_PARSERS = {"hermes": HermesParser}
