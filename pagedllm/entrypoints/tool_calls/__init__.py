"""Tool calling for chat completions (OpenAI's `tools` and `tool_choice`): which calls a request allows and the
grammar that holds a forced call to its schema (choice.py), the parsers that find calls in a model's own text
(parsers.py), and a choice's text turned into its message or stream (extract.py)."""

from pagedllm.entrypoints.tool_calls.choice import ToolChoice, check_tools, resolve_tool_choice
from pagedllm.entrypoints.tool_calls.extract import ParsedMessage, ToolCall, ToolCallStream, parse_message
from pagedllm.entrypoints.tool_calls.parsers import TOOL_CALL_PARSERS

__all__ = ["TOOL_CALL_PARSERS", "ParsedMessage", "ToolCall", "ToolCallStream", "ToolChoice", "check_tools",
           "parse_message", "resolve_tool_choice"]
