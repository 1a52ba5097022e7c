"""The request body of POST /v1/responses (OpenAI's Responses API: text and function calls), and its chat request.

A response is a chat completion underneath: the instructions become a system message, the input the messages
(an earlier answer's items one assistant message, as vLLM joins them: its reasoning as the message's reasoning,
its text, its function calls as tool_calls; their outputs tool messages), the
function tools the chat's tools, and the chat path's template, limits, sampling and tool calling apply. A stored
response's conversation (previous_response_id) comes before the input; `include: ["message.output_text.logprobs"]`
asks the chat for its logprobs (top_logprobs alternatives each). What this server cannot honour (other tools,
stored conversation objects) is refused with a 400 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationError

from pagedllm.entrypoints.protocol import (KEEP_EXTRA, ChatCompletionRequest, Int64, RepetitionPenalty, Stop,
                                           StrictBody, Temperature, ThinkingTokenBudget, refuse_not_taken)
from pagedllm.errors import InvalidInputError
from pagedllm.sampling_params import MAX_LOGPROBS

# the fields a response passes to its chat completion under the same names
CHAT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
               "seed", "user", "skip_special_tokens", "include_reasoning", "stream", "parallel_tool_calls",
               "cache_salt", "priority", "request_id", "structured_outputs", "stop", "stop_token_ids", "ignore_eos",
               "include_stop_str_in_output", "logit_bias", "chat_template_kwargs", "thinking_token_budget",
               "repetition_detection")
OUTPUT_LOGPROBS = "message.output_text.logprobs"  # the value of `include` that adds something here
# the others vLLM takes: what they ask for is never made here (encrypted reasoning, the outputs of tools other
# than functions, input images), so they add nothing, as in vLLM
INCLUDABLE = (OUTPUT_LOGPROBS, "reasoning.encrypted_content", "code_interpreter_call.outputs",
              "computer_call_output.output.image_url", "file_search_call.results", "message.input_image.image_url")


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


class FunctionCallItem(StrictBody):
    """A function call of an earlier answer, sent back as input."""

    model_config = ConfigDict(strict=True, extra="allow")  # its item id and status
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class ReasoningText(StrictBody):
    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(StrictBody):
    """An earlier answer's reasoning, sent back as input (its text: the content's, else the summary's)."""

    model_config = ConfigDict(strict=True, extra="allow")  # its item id and status
    type: Literal["reasoning"]
    content: list[ReasoningText] | None = None
    summary: list[ReasoningText] = []
    encrypted_content: str | None = None

    def text(self) -> str:
        if self.encrypted_content is not None:
            raise InvalidInputError("input: a reasoning item's encrypted_content is not supported (none is made "
                                    "here): send its content")
        parts = self.content or self.summary
        return parts[0].text if parts else ""


class FunctionCallOutput(StrictBody):
    """What a function call returned, for the model to read."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["function_call_output"]
    call_id: str
    output: str


InputItem = InputMessage | FunctionCallItem | FunctionCallOutput | ReasoningItem


class TextFormat(StrictBody):
    model_config = ConfigDict(strict=True, extra="allow")  # description, strict
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class TextConfig(StrictBody):
    format: TextFormat | None = None


class ResponseChat(ChatCompletionRequest):
    """The chat completion a response runs as: its token limit is named as the response names it."""

    def asked_max_tokens(self) -> tuple[int | None, str]:
        return self.max_completion_tokens, "max_output_tokens"


class ResponsesRequest(StrictBody):
    model_config = KEEP_EXTRA  # vLLM's fields this server does not take are refused (refuse_not_taken)
    model: str | None = None
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: Temperature | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: RepetitionPenalty | None = None
    seed: Int64 | None = None  # vLLM's
    cache_salt: str | None = Field(default=None, min_length=1)  # vLLM's: a different salt shares no cached prefix
    priority: Int64 = 0  # vLLM's, as chat's
    request_id: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: the id is "resp_<request_id>"
    structured_outputs: dict[str, Any] | None = None  # vLLM's, as chat's (not with a text.format JSON schema)
    stop: Stop = None  # vLLM's extras from here to chat_template_kwargs: chat's fields, with chat's types and checks
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logit_bias: dict[str, float] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    thinking_token_budget: ThinkingTokenBudget = None  # vLLM's chat field, taken here too: reasoning models answer here
    repetition_detection: dict[str, Any] | None = None  # vLLM's chat field, taken here too
    prompt_cache_key: str | None = None  # OpenAI's cache hint: taken, as the prefix cache finds shared prefixes itself
    session_id: str | None = None  # vLLM's routing hint, as chat's: taken
    service_tier: str | None = None  # "auto" or "default": there is one tier
    stream: bool = False
    text: TextConfig | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...} goes to the chat template as reasoning_effort
    metadata: dict[str, str] | None = None  # given back in the response
    user: str | None = None
    store: bool | None = None  # where the server keeps responses (--responses-store-size): false keeps this one out
    previous_response_id: str | None = None  # a stored response this one continues
    background: bool | None = None  # answered at once, run on; GET /v1/responses/{id} shows it (needs the store)
    truncation: Literal["disabled"] | None = None
    include_reasoning: bool = True  # vLLM's: with a reasoning parser, the reasoning item (false: left out)
    skip_special_tokens: bool = True
    tools: list[dict[str, Any]] | None = None  # function tools (OpenAI's flat form)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    include: list[str] | None = None  # INCLUDABLE; OUTPUT_LOGPROBS: the answer's logprobs in its output_text
    top_logprobs: int | None = None  # alternatives per token with OUTPUT_LOGPROBS (without it: not used, as vLLM)
    # OpenAI's bound on calls of its built-in tools, which this server has none of: given back, limits nothing (vLLM's)
    max_tool_calls: int | None = Field(default=None, ge=1)
    # OpenAI fields this server does not take: declared so that they are refused, not dropped as unknown
    conversation: Any = None
    prompt: Any = None
    previous_input_messages: Any = None  # vLLM's, for harmony models
    enable_response_messages: bool | None = None  # vLLM's, for harmony models

    def chat_conversation(self, history: list[dict[str, Any]] = ()) -> list[dict[str, Any]]:
        """The chat messages this request answers, without its instructions: a stored conversation it continues
        (previous_response_id), then its input."""
        turn = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else chat_messages(self.input)
        return [*history, *turn]

    def to_chat(self, history: list[dict[str, Any]] = ()) -> ResponseChat:
        """The same request as a chat completion (the chat path then checks its values), continuing `history`: the
        instructions as a system message first (a previous response's are not carried over, as in OpenAI's API)."""
        self._refuse_unsupported()
        messages = [{"role": "system", "content": self.instructions}] if self.instructions is not None else []
        messages += self.chat_conversation(history)
        fields = {name: getattr(self, name) for name in CHAT_FIELDS if getattr(self, name) is not None}
        if self.includes_logprobs:
            fields.update(logprobs=True, top_logprobs=self.top_logprobs)
        effort = (self.reasoning or {}).get("effort")
        try:
            return ResponseChat(messages=messages, max_completion_tokens=self.max_output_tokens,
                                response_format=self._response_format(), reasoning_effort=effort,
                                tools=chat_tools(self.tools), tool_choice=chat_tool_choice(self.tool_choice), **fields)
        except ValidationError as exc:  # a value this body took that the chat's fields do not: a 400 naming it
            error = exc.errors()[0]
            name = error["loc"][0] if error["loc"] else "input"
            raise InvalidInputError(f"{name} is not valid: {error['msg']}") from None

    @property
    def includes_logprobs(self) -> bool:
        return OUTPUT_LOGPROBS in (self.include or [])

    @property
    def tool_choice_shown(self) -> str | dict[str, Any]:
        """The response's `tool_choice`: as asked for, else "auto" with tools and "none" without."""
        return self.tool_choice if self.tool_choice is not None else ("auto" if self.tools else "none")

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
        refuse_not_taken(self.model_extra)
        why = {"conversation": "conversations are not stored: send it as input, or continue a stored response with "
                               "previous_response_id",
               "prompt": "stored prompt templates are not supported",
               "previous_input_messages": "send earlier turns as input items",
               "enable_response_messages": "the response's messages are not returned"}
        for name, reason in why.items():
            value = getattr(self, name)
            if value not in (None, False, [], 0):
                raise InvalidInputError(f"{name} is not supported on /v1/responses: {reason}")
        if other := [value for value in self.include or [] if value not in INCLUDABLE]:
            raise InvalidInputError(f"include: {other[0]!r} is not one of {', '.join(INCLUDABLE)}")
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= MAX_LOGPROBS:
            raise InvalidInputError(f"top_logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.top_logprobs}")
        if self.service_tier not in (None, "auto", "default"):
            raise InvalidInputError(f"service_tier {self.service_tier!r} is not supported: there is one tier (auto)")
        if isinstance(self.reasoning, dict) and set(self.reasoning) - {"effort", "summary"}:
            raise InvalidInputError("reasoning takes effort (and summary) only")


def chat_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """Input items as chat messages, an answer's items joined as vLLM joins them: a reasoning item, an assistant
    message and function calls that follow an assistant message fill in its reasoning, content and tool_calls
    where it has none yet; each function call output is a tool message."""
    messages: list[dict[str, Any]] = []
    for item in items:
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if isinstance(item, FunctionCallOutput):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        elif isinstance(item, ReasoningItem):
            if last is not None and last.get("reasoning") is None:
                last["reasoning"] = item.text()
            else:
                messages.append({"role": "assistant", "content": None, "reasoning": item.text()})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            if last is None:
                messages.append(last := {"role": "assistant", "content": None})
            last.setdefault("tool_calls", []).append(call)
        elif item.role == "assistant" and last is not None and last["content"] is None:
            last["content"] = item.as_chat()["content"]
        else:
            messages.append(item.as_chat())
    return messages


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools in OpenAI's flat Responses form ({"type", "name", "parameters", ...}) as chat's."""
    if tools is None:
        return None
    chat = []
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise InvalidInputError(f"tools: only function tools are supported, got {kind!r}")
        chat.append({"type": "function", "function": {key: value for key, value in tool.items()
                                                       if key in ("name", "description", "parameters")}})
    return chat


def chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """tool_choice as chat's: the same strings; {"type": "function", "name"} nested as chat nests it."""
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise InvalidInputError('tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}')
    return {"type": "function", "function": {"name": choice["name"]}}
