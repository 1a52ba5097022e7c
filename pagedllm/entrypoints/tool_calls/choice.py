"""What a chat request's `tools` and `tool_choice` allow, checked as vLLM checks them, and the structured-output
constraint that holds a forced call to its function's parameters.

- "none": the tools reach the chat template; the answer is text.
- "auto" (the default when tools are given): the model decides; a tool-call parser finds its calls in the text
  (the server's `--enable-auto-tool-choice --tool-call-parser NAME`, as in vLLM).
- "required": the answer is a JSON list of one or more `{"name", "parameters"}` calls of the given functions.
- `{"type": "function", "function": {"name": N}}`: the answer is the arguments of N, a JSON value its
  parameters' schema accepts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from pagedllm.errors import InvalidInputError
from pagedllm.structured_outputs import StructuredOutputsParams

EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
MODES = ("none", "auto", "required")
NAMED_USAGE = 'use {"type": "function", "function": {"name": "my_function"}}'


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: str  # "none", "auto", "required" or "named"
    tools: list[dict[str, Any]]
    function: str | None = None  # the named function
    parallel: bool = True  # parallel_tool_calls: more than one call per answer
    parser: str | None = None  # the server's tool-call parser: finds "auto"'s calls, and says how call ids look

    @property
    def forced(self) -> bool:
        """Whether the grammar holds the whole answer to a call ("required" or named)."""
        return self.mode in ("required", "named")

    def constraint(self) -> StructuredOutputsParams | None:
        """The JSON schema a forced answer is held to (None for "none" and "auto")."""
        if self.mode == "named":
            return StructuredOutputsParams(json=_parameters(_function(self.tools, self.function)))
        if self.mode == "required":
            return StructuredOutputsParams(json=_calls_schema(self.tools, self.parallel))
        return None


def check_tools(tools: Any) -> list[dict[str, Any]]:
    """The request's function tools, checked: each `{"type": "function", "function": {"name", "description"?,
    "parameters"?}}`, names unique."""
    if not isinstance(tools, list) or not tools:
        raise InvalidInputError("tools must be a non-empty list of function tools (leave the field out for none)")
    names = set()
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise InvalidInputError(f'tools[{i}] must be {{"type": "function", "function": {{...}}}} (only function '
                                    "tools are supported)")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInputError(f"tools[{i}].function.name must be a non-empty string")
        if name in names:
            raise InvalidInputError(f"tools names the function {name!r} twice")
        names.add(name)
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidInputError(f"tools[{i}].function.parameters must be a JSON schema object")
        if not isinstance(function.get("description", ""), str):
            raise InvalidInputError(f"tools[{i}].function.description must be a string")
    return tools


def resolve_tool_choice(tools: list[dict[str, Any]] | None, tool_choice: Any, parallel_tool_calls: bool | None,
                        parser: str | None, auto_enabled: bool) -> ToolChoice | None:
    """The request's tool choice (None: the request has no tools and asks for none). `parser` and `auto_enabled`:
    the server's --tool-call-parser and --enable-auto-tool-choice."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise InvalidInputError("tool_choice needs tools: give the functions in tools")
        return None
    tools = check_tools(tools)
    parallel = parallel_tool_calls is not False
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        return ToolChoice("named", tools, _named(choice, tools), parallel, parser)
    if choice not in MODES:
        raise InvalidInputError(f'tool_choice must be "none", "auto", "required" or a named function ({NAMED_USAGE}); '
                                f"got {choice!r}")
    if choice == "auto" and not (auto_enabled and parser):
        raise InvalidInputError('tool_choice "auto" (the default when tools are given) needs the server started with '
                                '--enable-auto-tool-choice and --tool-call-parser; or ask for "none", "required" or a '
                                "named function")
    return ToolChoice(choice, tools, None, parallel, parser)


def _named(choice: dict[str, Any], tools: list[dict[str, Any]]) -> str:
    function = choice.get("function")
    if choice.get("type") != "function" or not isinstance(function, dict):
        raise InvalidInputError(f"tool_choice as an object must name a function: {NAMED_USAGE}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"tool_choice.function.name must be a non-empty string: {NAMED_USAGE}")
    _function(tools, name)
    return name


def _function(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    for tool in tools:
        if tool["function"]["name"] == name:
            return tool["function"]
    raise InvalidInputError(f"tool_choice names the function {name!r}, which is not among the tools")


def _parameters(function: dict[str, Any]) -> dict[str, Any]:
    """The function's parameters schema (an empty object's where it has none)."""
    return function.get("parameters") or EMPTY_PARAMETERS


def _calls_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A JSON list of one or more calls (one at most without parallel calls), each `{"name": N, "parameters": P}`
    of one of the functions; the functions' `$defs` joined at the top, where their references point."""
    calls, defs = [], {}
    for tool in tools:
        function = tool["function"]
        parameters = copy.deepcopy(_parameters(function))
        for def_name, schema in (parameters.pop("$defs", None) or {}).items():
            if defs.setdefault(def_name, schema) != schema:
                raise InvalidInputError(f"tools define {def_name!r} in $defs twice, differently")
        calls.append({"properties": {"name": {"type": "string", "enum": [function["name"]]}, "parameters": parameters},
                      "required": ["name", "parameters"]})
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema
