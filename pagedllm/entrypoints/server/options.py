"""What the server's API does beyond each request's own fields, as `pagedllm serve` sets it (vLLM's frontend flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedllm.entrypoints.protocol import SamplingFields, StreamOptions


@dataclass(frozen=True)
class ServerOptions:
    chat_template: str | None = None  # --chat-template: the template chats go through, in place of the model's
    trust_request_chat_template: bool = False  # a request may bring its own chat_template
    default_chat_template_kwargs: dict[str, Any] | None = None  # under every chat's own chat_template_kwargs
    responses_store_size: int = 0  # Responses API responses kept (0: none)
    enable_tokenizer_info: bool = False  # serve GET /tokenizer_info
    enable_prompt_tokens_details: bool = False  # usage.prompt_tokens_details: the prompt tokens served from cache
    enable_force_include_usage: bool = False  # every stream ends with its usage, as stream_options.include_usage
    return_tokens_as_token_ids: bool = False  # the default of the requests' return_tokens_as_token_ids
    # cross-origin browser access (vLLM's flags): none unless origins are allowed
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


def apply_server_defaults(body: SamplingFields, options: ServerOptions) -> None:
    """A completion's or chat's body as the options make it, in place: the server's return_tokens_as_token_ids
    where the request says nothing, and a stream's usage where they force it."""
    if body.return_tokens_as_token_ids is None:
        body.return_tokens_as_token_ids = options.return_tokens_as_token_ids
    if options.enable_force_include_usage and body.stream:
        body.stream_options = (body.stream_options or StreamOptions()).model_copy(update={"include_usage": True})
