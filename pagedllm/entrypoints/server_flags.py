"""`pagedllm serve`'s flags for what the API does beyond each request's fields (most of them vLLM's frontend
flags), and the ServerOptions they make."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the server's modules load when it starts, not with the command line
    from pagedllm.entrypoints.server.options import ServerOptions


def add_api_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--responses-store-size", type=int, default=0,
                        help="keep up to this many /v1/responses answers in memory, for previous_response_id, "
                             "background runs and GET /v1/responses/{id} (default 0: none kept, as vLLM)")
    parser.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                        help="serve vLLM's GET /tokenizer_info (the tokenizer's configuration and chat template)")
    parser.add_argument("--enable-server-load-tracking", action="store_true",
                        help="taken for vLLM's command lines: GET /load always counts the generating calls here")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help="usage gives prompt_tokens_details.cached_tokens, the prompt tokens served from the "
                             "prefix cache (vLLM's)")
    parser.add_argument("--enable-force-include-usage", action="store_true",
                        help="every stream ends with its usage, as if stream_options.include_usage were set (vLLM's)")
    parser.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=False,
                        help="log each request's id, prompt lengths and sampling parameters (at --log-level debug "
                             "its prompt token ids too), as vLLM's flag")
    parser.add_argument("--return-tokens-as-token-ids", action="store_true",
                        help="logprobs name tokens \"token_id:<id>\" unless a request says otherwise (vLLM's)")
    parser.add_argument("--default-chat-template-kwargs", default=None, type=_json_object, metavar="JSON",
                        help="chat template kwargs every chat gets under its own chat_template_kwargs, which win "
                             "(vLLM's; e.g. '{\"enable_thinking\": false}' for a Qwen3 without thinking)")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="let a request bring its own chat_template (vLLM's flag; the template runs in Jinja's "
                             "sandbox, yet is code from the client)")
    cors = parser.add_argument_group("cross-origin browser access (vLLM's flags; none by default)")
    cors.add_argument("--allowed-origins", type=_json_strings, default=[], metavar="JSON",
                      help='origins allowed, a JSON list (e.g. \'["https://app.example"]\' or \'["*"]\')')
    cors.add_argument("--allowed-methods", type=_json_strings, default=["*"], metavar="JSON",
                      help='methods allowed, a JSON list (default ["*"])')
    cors.add_argument("--allowed-headers", type=_json_strings, default=["*"], metavar="JSON",
                      help='headers allowed, a JSON list (default ["*"])')
    cors.add_argument("--allow-credentials", action="store_true", help="allow credentials (cookies) cross-origin")


def server_options(args: argparse.Namespace, chat_template: str | None) -> ServerOptions:
    """The API's options from the command line, each flag under its field's name (chat_template: --chat-template's
    text)."""
    from pagedllm.entrypoints.server.options import ServerOptions

    given = {field.name: getattr(args, field.name) for field in fields(ServerOptions) if hasattr(args, field.name)}
    lists = {name: tuple(given[name]) for name in ("allowed_origins", "allowed_methods", "allowed_headers")}
    return ServerOptions(**{**given, **lists, "chat_template": chat_template,
                            "enable_tokenizer_info": args.enable_tokenizer_info_endpoint})


def _json_value(text: str) -> Any:
    """A command line's JSON value (argparse names the flag where this raises)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _json_object(text: str) -> dict[str, Any]:
    value = _json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


def _json_strings(text: str) -> list[str]:
    value = _json_value(text)
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise argparse.ArgumentTypeError(f"a JSON list of strings is needed, got {text!r}")
    return value
