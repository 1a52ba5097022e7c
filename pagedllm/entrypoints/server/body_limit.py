"""ASGI middleware: refuse a request body past --max-request-bytes before anything parses it.

A declared Content-Length over the cap is answered 413 at once, without reading the body; a
body sent without one (chunked) is counted as it arrives and refused the moment it passes the cap.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedllm.entrypoints.server.errors import body_too_large, error_response


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await error_response(body_too_large(self.max_bytes))(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        """`receive` that raises the 413 (rendered by the app's error handlers) past the cap."""
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise body_too_large(self.max_bytes)
            return message

        return counted


def _content_length(scope: Scope) -> int | None:
    """The declared body length; an unreadable one counts as too large."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 2**63
    return None
