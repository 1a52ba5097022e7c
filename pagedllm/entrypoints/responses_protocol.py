"""The request body of POST /v1/responses (OpenAI's Responses API, text in and text out), and its chat request.

A response is a chat completion underneath: the instructions become a system message, the input the messages,
and the chat path's template, limits and sampling apply. What this server cannot honour (tools, stored
conversations, background runs, logprobs) is refused with a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from pagedllm.entrypoints.protocol import ChatCompletionRequest, RepetitionPenalty, StrictBody, Temperature
from pagedllm.errors import InvalidInputError

# the fields a response passes to its chat completion under the same names
CHAT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
               "user", "skip_special_tokens", "include_reasoning", "stream")


class InputText(StrictBody):
    model_config = ConfigDict(strict=True, extra="allow")  # an earlier answer's output_text has annotations
    type: Literal["input_text", "output_text"]
    text: str


class InputMessage(StrictBody):
    model_config = ConfigDict(strict=True, extra="allow")  # an earlier output item has its id and status
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[InputText]

    def as_chat(self) -> dict[str, Any]:
        """The chat message: text parts as the chat's text parts, which the template joins as chat's are."""
        if isinstance(self.content, str):
            return {"role": self.role, "content": self.content}
        return {"role": self.role, "content": [{"type": "text", "text": part.text} for part in self.content]}


class TextFormat(StrictBody):
    model_config = ConfigDict(strict=True, extra="allow")  # description, strict
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class TextConfig(StrictBody):
    format: TextFormat | None = None


class ResponsesRequest(StrictBody):
    model: str | None = None
    input: str | Annotated[list[InputMessage], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: Temperature | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: RepetitionPenalty | None = None
    stream: bool = False
    text: TextConfig | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...} goes to the chat template as reasoning_effort
    metadata: dict[str, str] | None = None  # given back in the response
    user: str | None = None
    store: bool | None = None  # nothing is stored: the response says "store": false
    truncation: Literal["disabled"] | None = None
    include_reasoning: bool = True  # vLLM's: with a reasoning parser, the reasoning item (false: left out)
    skip_special_tokens: bool = True
    # OpenAI fields this server does not take: declared so that they are refused, not dropped as unknown
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    include: list[str] | None = None
    prompt: Any = None
    top_logprobs: int | None = None

    def to_chat(self) -> ChatCompletionRequest:
        """The same request as a chat completion (the chat path then checks its values)."""
        self._refuse_unsupported()
        messages = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            messages += [message.as_chat() for message in self.input]
        fields = {name: getattr(self, name) for name in CHAT_FIELDS if getattr(self, name) is not None}
        effort = (self.reasoning or {}).get("effort")
        return ChatCompletionRequest(messages=messages, max_completion_tokens=self.max_output_tokens,
                                     response_format=self._response_format(), reasoning_effort=effort, **fields)

    def text_config(self) -> dict[str, Any]:
        """The response's `text` field: the format as asked for, {"type": "text"} by default."""
        if self.text is None or self.text.format is None:
            return {"format": {"type": "text"}}
        return {"format": self.text.format.model_dump(by_alias=True, exclude_none=True)}

    def _response_format(self) -> dict[str, Any] | None:
        """text.format as the chat's response_format (a JSON schema given flat here, nested there)."""
        format_ = self.text.format if self.text is not None else None
        if format_ is None or format_.type != "json_schema":
            return None if format_ is None else {"type": format_.type}
        if format_.schema_ is None:
            raise InvalidInputError("text.format json_schema must give its schema")
        return {"type": "json_schema", "json_schema": {"name": format_.name or "response", "schema": format_.schema_}}

    def _refuse_unsupported(self) -> None:
        why = {"tools": "use /v1/chat/completions for tool calling",
               "tool_choice": "use /v1/chat/completions for tool calling",
               "previous_response_id": "responses are not stored: send the conversation as input",
               "conversation": "responses are not stored: send the conversation as input",
               "background": "responses run in the foreground only", "include": "nothing extra can be included",
               "prompt": "stored prompt templates are not supported", "top_logprobs": "logprobs are not supported here"}
        for name, reason in why.items():
            value = getattr(self, name)
            if value not in (None, False, [], 0, "none", "auto"):
                raise InvalidInputError(f"{name} is not supported on /v1/responses: {reason}")
        if isinstance(self.reasoning, dict) and set(self.reasoning) - {"effort", "summary"}:
            raise InvalidInputError("reasoning takes effort (and summary) only")
