"""Request bodies of the OpenAI-compatible API (pydantic), and their mapping to SamplingParams.

Strict types: a string where a number belongs is a 400, not a silent coercion, and numbers must
be finite. Unknown fields are ignored, as OpenAI clients send many that do not change what this
engine computes; known ones this engine cannot honour are refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pagedllm.entrypoints.beam_search import beam_temperature
from pagedllm.entrypoints.tool_calls import ToolChoice, check_tools, resolve_tool_choice
from pagedllm.errors import InvalidInputError
from pagedllm.model.chat_template import message_text
from pagedllm.sampling_params import MAX_REPETITION_PENALTY, MAX_TEMPERATURE, MIN_REPETITION_PENALTY, SamplingParams
from pagedllm.structured_outputs import StructuredOutputsParams

Prompt = str | list[int] | list[str] | list[list[int]]  # the batch forms are capped in prompts()
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# SamplingParams' bounds, checked where the request is parsed so that the error names the JSON field
Temperature = Annotated[float, Field(ge=0.0, le=MAX_TEMPERATURE)]
RepetitionPenalty = Annotated[float, Field(ge=MIN_REPETITION_PENALTY, le=MAX_REPETITION_PENALTY)]
# Each stop string is looked for after every token and each prompt becomes an engine request:
# unbounded lists would let one request slow every step or flood the queue.
MAX_STOP_STRINGS = 32
Stop = str | Annotated[list[str], Field(max_length=MAX_STOP_STRINGS)] | None
MAX_PROMPTS = 1024
ThinkingTokenBudget = Annotated[int, Field(ge=-1)] | None  # -1 or null: no limit


class StrictBody(BaseModel):
    """A request body's model: strict types, finite numbers, unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


KEEP_EXTRA = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)  # as StrictBody, unknown fields kept


class StreamOptions(StrictBody):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk carries its usage so far


_GUIDED = "use structured_outputs (or response_format), as vLLM has since it dropped the guided_ fields"
# vLLM's extras the generating endpoints do not take, with why (refused where given, not dropped as unknown)
NOT_TAKEN = {
    "guided_json": _GUIDED,
    "guided_regex": _GUIDED,
    "guided_choice": _GUIDED,
    "guided_grammar": _GUIDED,
    "vllm_xargs": "there are no custom extensions",
    "watermarking": "outputs are not watermarked",
    "return_token_offsets": "use /tokenize",
    "prompt_embeds": "prompts are text or token ids",
    "kv_transfer_params": "there is no KV transfer between servers",
    "ec_transfer_params": "there is no encoder cache transfer",
    "mm_payload": "the models here read text only",
    "mm_processor_kwargs": "the models here read text only",
    "media_io_kwargs": "the models here read text only",
    "return_mm_kwargs": "the models here read text only",
    "routed_experts_prompt_start": "the models here have no experts",
}


def refuse_not_taken(extra: dict[str, Any] | None) -> None:
    """A 400 for the first field of a body's extras (not null / false) that this server knows and does not take."""
    for name, reason in NOT_TAKEN.items():
        if (extra or {}).get(name) not in (None, False):  # 0 is given
            raise InvalidInputError(f"{name} is not supported: {reason}")


class SamplingFields(StrictBody):
    """Fields both endpoints share (OpenAI's plus vLLM's usual extras). Unknown fields are kept aside (model_extra),
    so that those this server knows and does not take are refused."""

    model_config = KEEP_EXTRA

    model: str | None = None
    n: int = 1
    temperature: Temperature | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: Int64 | None = None
    stop: Stop = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    priority: Int64 = 0  # vLLM's: with --scheduling-policy priority, lower is scheduled first
    request_id: str | None = Field(default=None, min_length=1, max_length=256)  # vLLM's: names the response
    session_id: str | None = None  # vLLM's routing hint for related requests: taken (one engine serves them all)
    stream_interval: int = Field(default=1, ge=1)  # vLLM's: tokens each streamed chunk of a choice gathers
    spaces_between_special_tokens: bool = True  # vLLM's; false is refused (see _refuse_unsupported)
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (structured outputs)
    add_special_tokens: bool | None = None  # vLLM's: the tokenizer's BOS/EOS (default: yes for a prompt, no for chat)
    truncate_prompt_tokens: int | None = None  # vLLM's: keep the prompt's last N tokens (-1: max_model_len)
    allowed_token_ids: list[int] | None = None  # vLLM's: only these tokens may be sampled
    bad_words: list[str] | None = None  # vLLM's: words never sampled
    thinking_token_budget: ThinkingTokenBudget = None  # vLLM's: reasoning blocks end after this many tokens
    repetition_detection: dict[str, Any] | None = None  # vLLM's: end an output that repeats a pattern
    truncation_side: Literal["left", "right"] | None = None  # vLLM's: which end truncate_prompt_tokens keeps
    structured_outputs: dict[str, Any] | None = None  # vLLM's: json, regex, choice, grammar or json_object
    use_beam_search: bool = False  # vLLM's: n beams (pagedllm/engine/beam.py); not streamed by /v1/completions
    length_penalty: float = 1.0  # vLLM's, with use_beam_search
    prompt_logprobs: int | None = None  # vLLM's: each prompt token's logprob and its top-k, in the response
    logprob_token_ids: list[int] | None = None  # vLLM's: these tokens' logprobs instead of the top-k (needs logprobs)
    return_token_ids: bool = False  # vLLM's: the prompt's and each choice's token ids beside the text
    return_tokens_as_token_ids: bool | None = None  # vLLM's: logprobs name tokens "token_id:<id>" (None: the server's)

    def check_streaming(self) -> None:
        if self.stream_options is not None and not self.stream:
            raise InvalidInputError("stream_options is only allowed when stream is true")
        if self.stream and self.prompt_logprobs is not None:
            raise InvalidInputError("prompt_logprobs is not available when stream is true")

    def _refuse_unsupported(self) -> None:
        refuse_not_taken(self.model_extra)
        if not self.spaces_between_special_tokens:
            raise InvalidInputError("spaces_between_special_tokens is not supported: false (special tokens' text is "
                                    "decoded as the tokenizer decodes it)")

    def _structured_outputs(self) -> StructuredOutputsParams | None:
        """vLLM's structured_outputs, or OpenAI's response_format: json_object (any JSON object) or json_schema
        (its json_schema.schema); not both."""
        from_format = _response_format(self.response_format)
        if from_format is not None and self.structured_outputs is not None:
            raise InvalidInputError("response_format other than text and structured_outputs cannot both be given")
        if self.structured_outputs is not None:
            return StructuredOutputsParams.from_value(self.structured_outputs)
        return from_format

    def _logprob_counts(self, top_k: int | None) -> dict[str, Any]:
        """SamplingParams' logprobs and logprob_token_ids for a request asking for `top_k` alternatives (None: no
        logprobs): vLLM's logprob_token_ids, where given, replace the top-k and need logprobs asked for."""
        if not self.logprob_token_ids:
            return {"logprobs": top_k}
        if top_k is None:
            raise InvalidInputError("logprob_token_ids needs logprobs: set logprobs (with chat, to true) as well")
        return {"logprobs": None, "logprob_token_ids": self.logprob_token_ids}

    def _sampling_kwargs(self, defaults: dict[str, Any]) -> dict[str, Any]:
        """The request's sampling fields; where it leaves one out, the model's default (generation_config.json)
        if it has one, else SamplingParams'."""
        kwargs: dict[str, Any] = {
            "n": self.n, "seed": self.seed, "stop": self.stop or [], "min_tokens": self.min_tokens,
            "stop_token_ids": self.stop_token_ids or [], "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output, "logit_bias": self._logit_bias(),
            "allowed_token_ids": self.allowed_token_ids, "truncate_prompt_tokens": self.truncate_prompt_tokens,
            "truncation_side": self.truncation_side or "left",
            "bad_words": self.bad_words, "structured_outputs": self._structured_outputs(),
            "thinking_token_budget": self.thinking_token_budget, "repetition_detection": self.repetition_detection,
        }
        optional = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                    "frequency_penalty", "repetition_penalty")
        if self.use_beam_search:  # the search scores the model's own log-probabilities: no sampling defaults
            given = {k: getattr(self, k) for k in optional if getattr(self, k) is not None}
            return {**kwargs, **given, "use_beam_search": True, "length_penalty": self.length_penalty,
                    "temperature": beam_temperature(0.0 if self.temperature is None else self.temperature)}
        kwargs.update({k: defaults[k] for k in optional if k in defaults})
        kwargs.update({k: getattr(self, k) for k in optional if getattr(self, k) is not None})
        return kwargs

    def _logit_bias(self) -> dict[int, float] | None:
        """OpenAI's {"token id": bias} with the ids as strings -> {id: bias}."""
        if not self.logit_bias:
            return None
        if bad := [key for key in self.logit_bias if not (key.isascii() and key.isdigit())]:
            raise InvalidInputError(f"logit_bias keys must be token ids (integers as strings), got {bad[:3]}")
        bias = {int(key): value for key, value in self.logit_bias.items()}
        if len(bias) < len(self.logit_bias):  # "1" and "01"
            raise InvalidInputError("logit_bias names a token id twice")
        return bias


def _response_format(response_format: dict[str, Any] | None) -> StructuredOutputsParams | None:
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind != "json_schema":
        raise InvalidInputError(f"response_format type {kind!r} is not supported; supported: text, json_object, "
                                "json_schema")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or spec.get("schema") is None:
        raise InvalidInputError("response_format json_schema must give json_schema.schema, the JSON schema")
    return StructuredOutputsParams(json=spec["schema"])


class CompletionRequest(SamplingFields):
    prompt: Prompt
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidInputError("prompt must not be empty")
        if isinstance(p[0], int):
            return [p]  # one prompt given as token ids
        if len(p) > MAX_PROMPTS:
            raise InvalidInputError(f"prompt may hold at most {MAX_PROMPTS} prompts, got {len(p)}")
        return list(p)

    @property
    def scores_the_prompt(self) -> bool:
        """echo with max_tokens 0: the prompt (and its logprobs) alone, as evaluation harnesses score a text."""
        return self.echo and self.max_tokens == 0

    def to_sampling_params(self, defaults: dict[str, Any] | None = None) -> SamplingParams:
        """defaults: the model's sampling defaults (LLMEngine.sampling_defaults); max_tokens keeps OpenAI's 16.
        Scoring the prompt runs one token, which the response leaves out (as vLLM does)."""
        self._refuse_unsupported()
        if self.suffix:
            raise InvalidInputError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidInputError("best_of is not supported (only best_of equal to n, which changes nothing)")
        if self.use_beam_search and self.stream:
            raise InvalidInputError("use_beam_search cannot be streamed by /v1/completions (as in vLLM): its beams "
                                    "are known only at the end")
        if self.scores_the_prompt and self.logprob_token_ids:
            raise InvalidInputError("logprob_token_ids needs generated tokens: echo with max_tokens 0 scores the "
                                    "prompt alone")
        max_tokens = 1 if self.scores_the_prompt else self.max_tokens
        return SamplingParams(max_tokens=max_tokens, prompt_logprobs=self.prompt_logprobs_k,
                              **self._logprob_counts(self.logprobs), **self._sampling_kwargs(defaults or {}))

    @property
    def prompt_logprobs_k(self) -> int | None:
        """The prompt logprobs to compute: as asked for, else the echoed prompt's (it comes with its logprobs)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None


class ContentPart(StrictBody):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class ChatMessage(StrictBody):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    reasoning: str | None = None  # vLLM's: an assistant message's thinking, for templates that show it
    reasoning_content: str | None = None  # the same under its older name

    def as_template_dict(self) -> dict[str, Any]:
        """The message's fields as given (pagedllm.model.chat_template normalises them for the template)."""
        message = self.model_dump(exclude_none=True, exclude={"content"})
        if isinstance(self.content, list):
            message["content"] = [part.model_dump(exclude_none=True) for part in self.content]
        else:
            message["content"] = self.content
        return message


class _TemplateFields(StrictBody):
    """How a request's messages go through the model's chat template (chat completions and /tokenize alike)."""

    messages: list[ChatMessage] | None = None
    tools: list[dict[str, Any]] | None = None  # function tools: to the chat template (pagedllm/entrypoints/tool_calls)
    documents: list[dict[str, Any]] | None = None  # to the chat template, as vLLM passes them
    reasoning_effort: str | None = None  # to the chat template
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # the request's own template: where the server trusts requests with one

    def check_template_fields(self) -> None:
        if self.tools is not None:
            check_tools(self.tools)

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.as_template_dict() for m in self.messages or []]

    def template_options(self) -> dict[str, Any]:
        """How the template renders the messages (pagedllm.model.chat_template.render_chat's options)."""
        kwargs = self.chat_template_kwargs
        if self.reasoning_effort is not None:
            kwargs = {**(kwargs or {}), "reasoning_effort": self.reasoning_effort}
        return {"add_generation_prompt": self.add_generation_prompt,
                "continue_final_message": self.continue_final_message,
                "template_kwargs": kwargs, "documents": self.documents, "tools": self.tools,
                "chat_template": self.chat_template}


class ChatCompletionRequest(SamplingFields, _TemplateFields):
    model_config = KEEP_EXTRA  # SamplingFields', not _TemplateFields'
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    functions: list[dict[str, Any]] | None = None  # OpenAI's older form of tools: refused
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    function_call: str | dict[str, Any] | None = None
    echo: bool = False  # vLLM's: the answer starts with the last message's text where that is the assistant's
    include_reasoning: bool = True  # vLLM's: with a reasoning parser, the message's reasoning (false: null)
    return_prompt_text: bool | None = None  # vLLM's: the templated prompt's text in the response (first chunk)

    def echoed_text(self) -> str:
        """What echo puts before each choice's text: the last message's, as the template read it, where it is an
        assistant message (as with continue_final_message); else nothing."""
        last = self.messages[-1]
        if not self.echo or last.role != "assistant":
            return ""
        return message_text(last.as_template_dict()["content"])

    def tool_choice_for(self, parser: str | None, auto_enabled: bool) -> ToolChoice | None:
        """The request's tools and tool_choice, checked; `parser` and `auto_enabled`: the server's
        --tool-call-parser and --enable-auto-tool-choice."""
        for name in ("functions", "function_call"):
            if getattr(self, name) is not None:
                raise InvalidInputError(f"{name} is not supported: use tools and tool_choice (OpenAI's newer form)")
        return resolve_tool_choice(self.tools, self.tool_choice, self.parallel_tool_calls, parser, auto_enabled)

    def to_sampling_params(self, defaults: dict[str, Any] | None = None,
                           tools: ToolChoice | None = None) -> SamplingParams:
        """defaults: the model's sampling defaults (LLMEngine.sampling_defaults), its max_tokens included. `tools`:
        the request's tool choice (tool_choice_for): a forced call holds the answer to its schema, and "auto" keeps
        special tokens in the text, where a model's tool-call tags may be ones."""
        defaults = defaults or {}
        self._refuse_unsupported()
        self.check_template_fields()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidInputError("top_logprobs requires logprobs to be true")
        max_tokens, max_tokens_field = self.asked_max_tokens()
        if max_tokens is None:
            max_tokens = defaults.get("max_tokens")
        logprobs = self._logprob_counts((self.top_logprobs or 0) if self.logprobs else None)
        kwargs = self._sampling_kwargs(defaults)
        if tools is not None and tools.forced:
            if kwargs["structured_outputs"] is not None:
                raise InvalidInputError("structured_outputs (or response_format) and a required or named tool_choice "
                                        "cannot both be given: the tool call's schema is the constraint")
            kwargs["structured_outputs"] = tools.constraint()
        if tools is not None and tools.mode == "auto":
            kwargs["skip_special_tokens"] = False
        try:
            return SamplingParams(max_tokens=max_tokens, **logprobs, prompt_logprobs=self.prompt_logprobs,
                                  **kwargs)
        except InvalidInputError as exc:  # named as this request named the field
            renamed = {"logprobs": "top_logprobs", "max_tokens": max_tokens_field}
            field, _, rest = str(exc).partition(" ")
            raise InvalidInputError(f"{renamed.get(field, field)} {rest}") from None

    def asked_max_tokens(self) -> tuple[int | None, str]:
        """The client's own token limit and the field it came in (max_completion_tokens wins over max_tokens)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class TokenizeRequest(_TemplateFields):
    """POST /tokenize: a prompt's ids as /v1/completions makes them, or messages' as /v1/chat/completions does."""

    model: str | None = None
    prompt: str | None = None
    add_special_tokens: bool | None = None  # default: the tokenizer's BOS for a prompt, none for messages
    return_token_strs: bool = False
    model_config = KEEP_EXTRA  # vLLM's multimodal fields are refused (refuse_not_taken)

    def check_input(self) -> None:
        refuse_not_taken(self.model_extra)
        if (self.prompt is None) == (self.messages is None):
            raise InvalidInputError("prompt or messages: give exactly one")
        self.check_template_fields()


class DetokenizeRequest(StrictBody):
    """POST /detokenize: token ids back to text."""

    model: str | None = None
    tokens: list[int]

