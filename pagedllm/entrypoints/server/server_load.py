"""GET /load, as vLLM's: how many generating calls (completions, chats, responses) the server is handling now.

A call counts from its request's arrival to its response's last byte (a stream's too); a background response
counts while its POST is answered, not while it runs. vLLM counts only with --enable-server-load-tracking and
answers 0 otherwise; here the count costs nothing, so it is always kept (the flag is taken for vLLM's command
lines).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

GENERATING = ("/v1/completions", "/v1/chat/completions", "/v1/responses")

router = APIRouter()


@router.get("/load")
async def server_load(request: Request) -> dict[str, int]:
    return {"server_load": request.app.state.server_load.count}


class LoadCounter:
    """The generating calls in flight (app.state.server_load)."""

    def __init__(self) -> None:
        self.count = 0


class ServerLoad:
    """ASGI middleware: counts the generating calls in flight into `counter`."""

    def __init__(self, app: Any, counter: LoadCounter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(GENERATING):
            await self.app(scope, receive, send)
            return
        self.counter.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter.count -= 1
