"""Run the real server (uvicorn + FastAPI) in a background thread on a free 127.0.0.1 port."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import uvicorn

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.engine.stats import EngineStats
from pagedllm.entrypoints.openai_server import bind, build_server
from pagedllm.entrypoints.server.options import ServerOptions


def parse_stream(lines: list[str]) -> tuple[list[dict], bool]:
    """SSE data lines -> chunks, and whether the stream ended with [DONE]."""
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert all(line == "" or line.startswith("data: ") for line in lines), lines[:5]
    done = bool(data) and data[-1] == "[DONE]"
    return [json.loads(d) for d in data if d != "[DONE]"], done


@dataclass
class RunningServer:
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def async_engine(self) -> AsyncEngine:
        return self.server.config.app.state.engine

    @property
    def model(self) -> str:
        return self.async_engine.model_name

    def stats(self) -> EngineStats:
        return self.async_engine.latest_stats

    def wait_idle(self, timeout: float = 10.0) -> EngineStats:
        """The engine's published stats once nothing runs or waits (or the last seen at timeout)."""
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while time.monotonic() < deadline:
            stats = self.stats()
            if stats.num_running == 0 and stats.num_waiting == 0 and stats.blocks_used == 0:
                break
            time.sleep(0.02)
        return stats

    def stop(self, timeout: float = 20.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def start_server(engine: Any, **options: Any) -> RunningServer:
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    options.setdefault("log_level", "warning")
    options.setdefault("shutdown_timeout", 2.0)
    api = {name: options.pop(name) for name in list(options) if name in ServerOptions.__dataclass_fields__}
    server = build_server(engine, "127.0.0.1", port, options=ServerOptions(**api), **options)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    return RunningServer(server, thread, port)
