"""Conversations through a model's chat template, the same for LLM.chat and the server.

Messages are normalised as vLLM's server takes them: the `developer` role is `system`, content given as a list
of text parts is their texts joined by newlines, and no content is an empty string. An assistant message's
`tool_calls` reach the template with each call's `arguments` as an object (OpenAI's clients send the JSON text;
the templates read the object, and arguments that are not a JSON object become `{}`, so that a conversation
holding one can go on); an empty list is dropped. An assistant message's reasoning (vLLM's `reasoning`, or
`reasoning_content`) reaches it under both names, as vLLM passes it for templates that show earlier thinking
(interleaved with tool calls); other roles' is dropped. Other keys (`name`, `tool_call_id`) reach it as given.
"""

import json
from typing import Any

from pagedllm.errors import InvalidInputError


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as chat templates expect them (see the module's docstring)."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise InvalidInputError("messages must be a list of {'role': ..., 'content': ...} dicts")
    return [_template_message(m) for m in messages]


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                documents: list[dict[str, Any]] | None = None, chat_template: str | None = None,
                tools: list[dict[str, Any]] | None = None, requested: bool = False) -> str:
    """The conversation (and documents and tools, for templates that take them) as the prompt text the model's
    template makes of it, or `chat_template` (a Jinja template's text) where given; `requested`: that template is
    the request's own, whose errors are its chat_template field's."""
    from jinja2 import TemplateError, TemplateSyntaxError

    if chat_template is None and getattr(tokenizer, "chat_template", "") is None:  # (a transformers tokenizer)
        raise InvalidInputError("messages: this model has no chat template; send a prompt to /v1/completions")
    check_template_kwargs(tokenizer, template_kwargs or {}, "chat_template_kwargs")
    if add_generation_prompt and continue_final_message:
        raise InvalidInputError("continue_final_message cannot be combined with add_generation_prompt (set it "
                                "to false)")
    options = dict(template_kwargs or {})
    field, source = ("chat_template", "the request's") if requested else ("messages", "the model's")
    if continue_final_message:
        options["continue_final_message"] = True
    if documents is not None:
        options["documents"] = documents
    if tools is not None:
        options["tools"] = tools
    if chat_template is not None:
        options["chat_template"] = chat_template
    try:
        return tokenizer.apply_chat_template(template_messages(messages), add_generation_prompt=add_generation_prompt,
                                             tokenize=False, **options)
    except TemplateSyntaxError as exc:
        raise InvalidInputError(f"{field}: {source} chat template does not compile: {exc}") from None
    except TemplateError as exc:  # the template's own complaint (e.g. roles out of order) says what is wrong
        raise InvalidInputError(f"{field}: {source} chat template refused these messages: {exc}") from None
    except Exception as exc:
        raise InvalidInputError(f"{field}: {source} chat template could not render these messages: "
                                f"{type(exc).__name__}: {exc}") from None


def load_chat_template(value: str) -> str:
    """A chat template given on the command line (`--chat-template`, as vLLM takes it): the template's text itself
    where it holds `{`, `}` or a newline, else the path of a file holding it. Checked to compile."""
    from jinja2 import Environment, TemplateSyntaxError

    if any(ch in value for ch in "{}\n"):
        text = value
    else:
        try:
            with open(value, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(f"--chat-template {value!r} is neither a template nor a file that can be read: "
                                    f"{exc}") from None
    try:
        Environment().parse(text)
    except TemplateSyntaxError as exc:
        raise InvalidInputError(f"--chat-template does not compile: {exc} (line {exc.lineno})") from None
    return text


def check_template_kwargs(tokenizer: Any, kwargs: dict[str, Any], name: str) -> None:
    """Template kwargs (`name`: where they come from) may not set the template call's own parameters."""
    if reserved := sorted(set(kwargs) & _call_parameters(tokenizer)):
        raise InvalidInputError(f"{name} may not set {', '.join(reserved)}: the template call's own parameters "
                                "(add_generation_prompt and continue_final_message are fields of the request)")


def _call_parameters(tokenizer: Any) -> set[str]:
    """The named parameters of the tokenizer's apply_chat_template (what template kwargs must not override)."""
    import inspect

    parameters = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    return {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidInputError(f"messages: every message needs a string 'role', got {role!r}")
    role = "system" if role == "developer" else role
    normalised = {**message, "role": role, "content": message_text(message.get("content"))}
    reasoning, older = normalised.pop("reasoning", None), normalised.pop("reasoning_content", None)
    reasoning = older if reasoning is None else reasoning
    if role == "assistant" and reasoning is not None:
        if not isinstance(reasoning, str):
            raise InvalidInputError(f"messages: an assistant message's reasoning must be text, got {reasoning!r}")
        normalised["reasoning"] = normalised["reasoning_content"] = reasoning
    if "tool_calls" in message:
        calls = _template_tool_calls(message["tool_calls"])
        if calls:
            normalised["tool_calls"] = calls
        else:
            del normalised["tool_calls"]
    return normalised


def _template_tool_calls(calls: Any) -> list[dict[str, Any]] | None:
    """An assistant message's tool calls with their arguments as objects (see the module's docstring)."""
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise InvalidInputError(f"messages: tool_calls must be a list of calls, got {calls!r}")
    result = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise InvalidInputError('messages: each of tool_calls must be {"type": "function", "function": '
                                    '{"name": ..., "arguments": ...}}')
        result.append({**call, "function": {**function, "arguments": _arguments_object(function.get("arguments"))}})
    return result


def _arguments_object(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            arguments = {}
    return arguments if isinstance(arguments, dict) else {}


def message_text(content: Any) -> str:
    """A message's content as the template reads it: a string, or its text parts joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InvalidInputError(f"messages: content must be a string or a list of text parts, got {content!r}")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text":
            raise InvalidInputError(f"messages: content parts of type {kind!r} are not supported; only text")
        if not isinstance(part.get("text"), str):
            raise InvalidInputError("messages: a content part of type 'text' needs its 'text' string")
        texts.append(part["text"])
    return "\n".join(texts)
