"""Tool-call parsers: where a model's own text holds tool calls, in the format its chat template taught it
(`--tool-call-parser`, as in vLLM).

`hermes` (Hermes 2 Pro and later, Qwen2.5, Qwen3 and other templates of that format): each call is a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>`; the text before the first
`<tool_call>` is the answer's content. A call cut short by the end of the answer is read up to that end.

`llama3_json` (Llama 3.1 and later with their templates' JSON calls): each call is a JSON object `{"name": ...,
"parameters": {...}}` (or `"arguments"`, which wins), after an optional `<|python_tag|>`, several joined by
anything (`; `); every `{` outside a call found so far begins one. The text before the first call is the content.

`pythonic` (Llama 3.2 and 4 with vLLM's pythonic templates, ToolACE, ...): the answer is a Python list of calls
with keyword arguments, `[get_weather(city="Paris"), get_time()]`, from its first character; the values are
literals (JSON's `true`, `false` and `null` read as such); there is no content.

`mistral` (Mistral's instruct models): the calls follow `[TOOL_CALLS]`, as a JSON list of `{"name", "arguments"}`
(or one such object; tokenizers before v11), or as `name[ARGS]{...}` (or `name{...}`), one after each
`[TOOL_CALLS]` (v11 and later); the text before the first `[TOOL_CALLS]` is the content. Call ids are 9 letters and
digits, as Mistral's templates require of the ids a conversation sends back.

Where any call does not parse, the whole text is the content and there are no calls (as vLLM reads it).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any

from pagedllm.entrypoints.text_tags import partial_tag_overlap


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
        """How much of a growing text is content for certain, and whether a call has begun."""
        return _content_before_tag(text, self.start)


class Llama3JsonParser:
    tag = "<|python_tag|>"
    _decoder = json.JSONDecoder()

    def parse(self, text: str) -> tuple[str | None, list[FoundCall]] | None:
        start = self._start(text)
        if start is None:
            return None
        calls, end = [], start
        while (brace := text.find("{", end)) >= 0:
            try:
                call, end = self._decoder.raw_decode(text, brace)
            except json.JSONDecodeError:
                return None
            arguments = call.get("arguments", call.get("parameters")) if isinstance(call, dict) else None
            if not isinstance(call.get("name") if isinstance(call, dict) else None, str) or arguments is None:
                return None
            calls.append(FoundCall(call["name"], arguments))
        return (text[:start] or None, calls) if calls else None

    def content_end(self, text: str) -> tuple[int, bool]:
        start = self._start(text)
        if start is not None:
            return start, True
        return len(text) - partial_tag_overlap(text, self.tag), False

    def _start(self, text: str) -> int | None:
        """Where the first call begins (its tag or its brace), if anywhere."""
        found = [i for i in (text.find(self.tag), text.find("{")) if i >= 0]
        return min(found) if found else None


class PythonicParser:
    _names = {"true": True, "false": False, "null": None}

    def parse(self, text: str) -> tuple[str | None, list[FoundCall]] | None:
        if not text.startswith("["):
            return None
        try:
            [statement] = ast.parse(text).body
            calls = statement.value.elts if isinstance(statement.value, ast.List) else None
            found = [self._call(call) for call in calls]
            json.dumps([call.arguments for call in found])  # only JSON values
        except (SyntaxError, ValueError, TypeError, AttributeError, RecursionError):
            return None
        return (None, found) if found else None

    def content_end(self, text: str) -> tuple[int, bool]:
        """All of the text is content unless it begins with "[", which makes it a call list, to be read whole."""
        if text.startswith("["):
            return 0, True
        return (0, False) if not text else (len(text), False)

    def _call(self, node: ast.expr) -> FoundCall:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            raise ValueError("not a call of a function by name with keyword arguments")
        if any(keyword.arg is None for keyword in node.keywords):
            raise ValueError("**kwargs")
        return FoundCall(node.func.id, {keyword.arg: self._value(keyword.value) for keyword in node.keywords})

    def _value(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Name) and node.id in self._names:
            return self._names[node.id]
        if isinstance(node, ast.Dict):
            return {self._value(k): self._value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self._value(element) for element in node.elts]
        return ast.literal_eval(node)


class MistralParser:
    start = "[TOOL_CALLS]"

    def parse(self, text: str) -> tuple[str | None, list[FoundCall]] | None:
        if self.start not in text:
            return None
        try:
            calls = [call for segment in text.split(self.start)[1:] for call in self._segment(segment.strip())]
        except (json.JSONDecodeError, ValueError):
            return None
        content = text[: text.index(self.start)]
        return (content or None, calls) if calls else None

    def content_end(self, text: str) -> tuple[int, bool]:
        return _content_before_tag(text, self.start)

    def _segment(self, segment: str) -> list[FoundCall]:
        if segment.startswith(("[", "{")):  # before v11: a JSON list of calls, or one call
            listed = json.loads(segment)
            return [self._listed(call) for call in (listed if isinstance(listed, list) else [listed])]
        name, separator, arguments = segment.partition("[ARGS]")
        if not separator:  # name{...}
            brace = segment.find("{")
            if brace < 0:
                raise ValueError("a call without arguments")
            name, arguments = segment[:brace], segment[brace:]
        if not name.strip():
            raise ValueError("a call without a name")
        return [FoundCall(name.strip(), json.loads(arguments))]

    @staticmethod
    def _listed(call: Any) -> FoundCall:
        if not (isinstance(call, dict) and isinstance(call.get("name"), str) and "arguments" in call):
            raise ValueError("not a {name, arguments} call")
        arguments = call["arguments"]
        return FoundCall(call["name"], json.loads(arguments) if isinstance(arguments, str) else arguments)


def _content_before_tag(text: str, tag: str) -> tuple[int, bool]:
    """A growing text whose calls begin at `tag`: up to the first `tag` (a call has begun), else all but an
    ending that may yet become one."""
    if tag in text:
        return text.index(tag), True
    return len(text) - partial_tag_overlap(text, tag), False


TOOL_CALL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "pythonic": PythonicParser,
                     "mistral": MistralParser}
