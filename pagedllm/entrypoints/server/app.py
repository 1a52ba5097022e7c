"""The FastAPI application: routes, error handlers, and the engine thread's lifetime."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.server import chat, completions, info
from pagedllm.entrypoints.server.errors import install_error_handlers
from pagedllm.entrypoints.server.logprobs import TokenText
from pagedllm.metrics import ServerMetrics


def create_app(engine: AsyncEngine, metrics: ServerMetrics, shutdown_timeout: float = 10.0) -> FastAPI:
    """An app serving `engine`; the engine thread starts and stops with the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop(timeout=shutdown_timeout)

    app = FastAPI(title="pagedllm", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.token_text = TokenText(engine.tokenizer)
    app.state.started = int(time.time())
    install_error_handlers(app)
    for module in (completions, chat, info):
        app.include_router(module.router)
    return app
