"""`pagedllm serve`: the OpenAI-compatible HTTP server (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
from typing import Any

from pagedllm.entrypoints.engine_args import add_engine_arguments, engine_config_from_args
from pagedllm.entrypoints.server_flags import add_api_arguments, server_options
from pagedllm.entrypoints.server import DEFAULT_MAX_REQUEST_BYTES
from pagedllm.entrypoints.tool_calls import TOOL_CALL_PARSERS

API_KEY_ENV = "PAGEDLLM_API_KEY"

logger = logging.getLogger("pagedllm.server")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-waiting-requests", type=int, default=None,
                        help="answer 503 with Retry-After past this many waiting requests")
    parser.add_argument("--shutdown-timeout", type=float, default=5.0,
                        help="seconds in-flight requests get to finish on SIGINT/SIGTERM")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                        help=f"key every route but /health requires (default ${API_KEY_ENV})")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help=f"answer 413 to a larger request body (default {DEFAULT_MAX_REQUEST_BYTES})")
    tools = parser.add_argument_group("tool calling")
    tools.add_argument("--tool-call-parser", default=None, choices=list(TOOL_CALL_PARSERS),
                       help="how the model writes tool calls, for tool_choice auto (hermes: JSON in <tool_call> "
                            "tags; llama3_json: Llama 3.1+ JSON; pythonic: [f(a=1), g()]; mistral: [TOOL_CALLS])")
    tools.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='let requests leave the choice of tools to the model (tool_choice "auto", the default '
                            "when tools are given); needs --tool-call-parser")
    parser.add_argument("--chat-template", default=None,
                        help="the chat template for chats, in place of the model's: a Jinja file, or the template "
                             "itself (text holding {, } or a newline), as vLLM takes it")
    add_api_arguments(parser)
    add_engine_arguments(parser)


def load_engine(config: Any) -> Any:
    """The engine to serve, warmed up (tests replace this to serve a fake one)."""
    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(config)
    engine.warm_up()
    return engine


def run(args: argparse.Namespace) -> int:
    from pagedllm.engine.engine_thread import EngineThread
    from pagedllm.entrypoints.openai_server import bind, build_server
    from pagedllm.entrypoints.server.memory import bound_onednn_cache
    from pagedllm.entrypoints.server.chat_parsers import ChatParsers
    from pagedllm.model.chat_template import load_chat_template
    from pagedllm.errors import InvalidInputError

    if args.max_waiting_requests is not None and args.max_waiting_requests < 1:
        raise InvalidInputError("--max-waiting-requests must be >= 1")
    if args.max_request_bytes < 1:
        raise InvalidInputError("--max-request-bytes must be >= 1")
    if args.responses_store_size < 0:
        raise InvalidInputError("--responses-store-size must be >= 0")
    if args.api_key is not None and not args.api_key.strip():
        raise InvalidInputError("--api-key must not be empty or blank")
    chat_parsers = ChatParsers(args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser)
    chat_template = None if args.chat_template is None else load_chat_template(args.chat_template)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(message)s")
    if not args.enable_log_requests:
        logging.getLogger("pagedllm.requests").setLevel(logging.WARNING)
    bound_onednn_cache()
    config = engine_config_from_args(args)
    engine_thread = EngineThread()  # builds the engine and then steps it: one OpenMP team
    engine = engine_thread.call(lambda: load_engine(config))
    sock = bind(args.host, args.port)
    server = build_server(engine, args.host, args.port, args.max_waiting_requests,
                          args.shutdown_timeout, args.log_level, api_key=args.api_key,
                          max_request_bytes=args.max_request_bytes, engine_thread=engine_thread,
                          chat_parsers=chat_parsers, options=server_options(args, chat_template))
    _log_startup(engine, args.host, sock.getsockname()[1])
    warn_if_exposed(args.host, sock.getsockname()[1], args.api_key)
    try:
        with _quiet_exit_signals():
            server.run(sockets=[sock])
    finally:
        getattr(engine, "shutdown", lambda: None)()  # the tensor-parallel workers, if any
    if server.engine.fatal is not None:
        logger.error("server stopped: the engine failed: %s", server.engine.fatal)
        return 1
    logger.info("server stopped")
    return 0


def _log_startup(engine: Any, host: str, port: int) -> None:
    """After the engine's own lines (device, dtype, the KV pool)."""
    logger.info("max model len %d; prefix caching %s", engine.max_model_len,
                "on" if engine.config.enable_prefix_caching else "off")
    logger.info("serving %s on http://%s:%d (dashboard: /dashboard)", engine.model_name, host, port)


def warn_if_exposed(host: str, port: int, api_key: str | None) -> None:
    if api_key is None and not is_loopback(host):
        logger.warning("no --api-key: anyone who can reach %s:%d can use this server, its metrics and its "
                       "dashboard; set --api-key or $%s", host, port, API_KEY_ENV)


def is_loopback(host: str) -> bool:
    """Whether `host` binds only this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to any interface
        return False


class _quiet_exit_signals:
    """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; make that a clean exit 0."""

    _SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self) -> None:
        self._saved = {sig: signal.signal(sig, lambda *_: None) for sig in self._SIGNALS}

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
