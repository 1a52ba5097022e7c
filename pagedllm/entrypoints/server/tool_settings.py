"""The server's tool-call settings (`--tool-call-parser`, `--enable-auto-tool-choice`, as in vLLM)."""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.entrypoints.tool_calls import TOOL_CALL_PARSERS
from pagedllm.errors import InvalidInputError


@dataclass(frozen=True, slots=True)
class ToolSettings:
    parser: str | None = None  # which parser finds tool calls in a model's text (tool_choice "auto")
    auto_tool_choice: bool = False  # whether requests may leave the choice to the model

    def __post_init__(self) -> None:
        if self.parser is not None and self.parser not in TOOL_CALL_PARSERS:
            raise InvalidInputError(f"--tool-call-parser {self.parser!r} is not known; known: "
                                    f"{', '.join(TOOL_CALL_PARSERS)}")
        if self.auto_tool_choice and self.parser is None:
            raise InvalidInputError("--enable-auto-tool-choice needs --tool-call-parser")
