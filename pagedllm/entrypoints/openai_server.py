"""The OpenAI-compatible server: build the app around an engine and run it under uvicorn."""

from __future__ import annotations

import logging
import socket

import uvicorn

from pagedllm.engine.async_engine import AsyncEngine, EngineProtocol
from pagedllm.engine.engine_thread import EngineThread
from pagedllm.entrypoints.server.app import create_app
from pagedllm.entrypoints.server import DEFAULT_MAX_REQUEST_BYTES
from pagedllm.entrypoints.server.memory import freed_memory_releaser
from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from pagedllm.entrypoints.server.options import ServerOptions
from pagedllm.metrics import ServerMetrics

logger = logging.getLogger("pagedllm.server")


class _Server(uvicorn.Server):
    """uvicorn, with a shutdown that lets requests finish for a grace period, then aborts them.

    Aborting through the engine lets every handler end its response cleanly (an error event on
    a stream, a 503 otherwise) instead of being cancelled mid-write.
    """

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine, grace: float) -> None:
        super().__init__(config)
        self.engine, self.grace = engine, grace

    def request_exit(self) -> None:
        """The engine can never run again (see AsyncEngine.fatal): shut down like on SIGTERM."""
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # stop accepting before waiting
        self.engine.refuse_new_requests()  # a handler still reading its body gets a 503, not a cut connection
        if not await self.engine.drain(self.grace):
            logger.info("aborting the requests still running after %.1f s", self.grace)
            self.engine.abort_all()
        await super().shutdown(sockets)


def build_server(engine: EngineProtocol, host: str = "127.0.0.1", port: int = 8000,
                 max_waiting_requests: int | None = None, shutdown_timeout: float = 5.0,
                 log_level: str = "info", api_key: str | None = None,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 engine_thread: EngineThread | None = None,
                 chat_parsers: ChatParsers = ChatParsers(), options: ServerOptions = ServerOptions()) -> uvicorn.Server:
    """A uvicorn server for `engine`; in-flight requests get `shutdown_timeout` s to finish on exit.
    `engine_thread`: the thread that built the engine, which then steps it too."""
    metrics = ServerMetrics(engine.model_name)
    async_engine = AsyncEngine(engine, observer=metrics, max_waiting_requests=max_waiting_requests,
                               on_idle=freed_memory_releaser(), on_fatal=lambda _: server.request_exit(),
                               thread=engine_thread)
    app = create_app(async_engine, metrics, api_key=api_key, max_request_bytes=max_request_bytes,
                     chat_parsers=chat_parsers, options=options)
    # uvicorn's own timeout is the fallback, should a handler not end after the abort.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=5.0, access_log=False)
    server = _Server(config, async_engine, grace=shutdown_timeout)
    return server


def bind(host: str, port: int) -> socket.socket:
    """A listening socket bound before uvicorn starts (port 0 picks a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock
