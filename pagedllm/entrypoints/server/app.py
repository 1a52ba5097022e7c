"""The FastAPI application: routes, error handlers, and the engine thread's lifetime."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.server import (DEFAULT_MAX_REQUEST_BYTES, chat, completions, info, prefix_cache, responses,
                                         server_load, tokenize)
from pagedllm.entrypoints.server.auth import APIKeyAuth
from pagedllm.entrypoints.server.body_limit import BodyLimit
from pagedllm.entrypoints.server.errors import install_error_handlers
from pagedllm.engine.token_text import TokenText
from pagedllm.entrypoints.server.prompts import PromptProcessor
from pagedllm.entrypoints.reasoning import think_token_ids
from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from pagedllm.entrypoints.server.options import ServerOptions
from pagedllm.entrypoints.server.response_store import ResponseStore
from pagedllm.entrypoints.server.server_load import LoadCounter, ServerLoad
from pagedllm.metrics import ServerMetrics


def create_app(engine: AsyncEngine, metrics: ServerMetrics, shutdown_timeout: float = 10.0,
               api_key: str | None = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
               chat_parsers: ChatParsers = ChatParsers(), options: ServerOptions = ServerOptions()) -> FastAPI:
    """An app serving `engine`; the engine thread starts and stops with the app's lifespan.

    With `api_key`, every route but /health needs it; bodies past `max_request_bytes` get a 413. `options`: what
    the API does beyond each request's fields (the chat template, the Responses store, usage details, ...).
    """
    prompts = PromptProcessor(engine.tokenizer, engine.vocab_size, engine.max_model_len,
                              chat_template=options.chat_template,
                              trust_request_chat_template=options.trust_request_chat_template,
                              default_template_kwargs=options.default_chat_template_kwargs)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop(timeout=shutdown_timeout)
            prompts.close()

    app = FastAPI(title="pagedllm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.token_text = TokenText(engine.tokenizer)
    app.state.started = int(time.time())
    app.state.prompts = prompts
    app.state.chat_parsers = chat_parsers
    app.state.options = options
    store_size = options.responses_store_size
    app.state.response_store = ResponseStore(store_size) if store_size > 0 else None
    # where a reasoning parser is on and the tags are tokens of their own, usage counts the reasoning's tokens
    vocab = engine.tokenizer.get_vocab() if chat_parsers.reasoning_parser else {}
    app.state.think_ids = think_token_ids(vocab)
    app.state.server_load = LoadCounter()
    app.add_middleware(ServerLoad, counter=app.state.server_load)
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    if api_key is not None:
        app.add_middleware(APIKeyAuth, api_key=api_key)
    if options.allowed_origins:  # added last, so it runs first: preflights need no key, and 401s carry its headers
        app.add_middleware(CORSMiddleware, allow_origins=list(options.allowed_origins),
                           allow_methods=list(options.allowed_methods), allow_headers=list(options.allowed_headers),
                           allow_credentials=options.allow_credentials)
    install_error_handlers(app)
    for module in (completions, chat, responses, tokenize, info, prefix_cache, server_load):
        app.include_router(module.router)
    if options.enable_tokenizer_info:
        app.include_router(tokenize.info_router)
    return app
