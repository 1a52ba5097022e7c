"""The server's chat parsers: where it looks for tool calls (`--tool-call-parser`, `--enable-auto-tool-choice`)
and for a thinking model's reasoning (`--reasoning-parser`) in the text, as in vLLM."""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.config import REASONING_PARSERS
from pagedllm.entrypoints.tool_calls import TOOL_CALL_PARSERS
from pagedllm.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class ChatParsers:
    tool_call_parser: str | None = None  # which parser finds tool calls in a model's text (tool_choice "auto")
    auto_tool_choice: bool = False  # whether requests may leave the choice of tools to the model
    reasoning_parser: str | None = None  # which parser splits a thinking model's reasoning from its content

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise InvalidInputError(f"--tool-call-parser {self.tool_call_parser!r} is not known; known: "
                                    f"{', '.join(TOOL_CALL_PARSERS)}")
        if self.auto_tool_choice and self.tool_call_parser is None:
            raise InvalidInputError("--enable-auto-tool-choice needs --tool-call-parser")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise InvalidInputError(f"--reasoning-parser {self.reasoning_parser!r} is not known; known: "
                                    f"{', '.join(REASONING_PARSERS)}")
