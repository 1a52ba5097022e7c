"""ASGI middleware: with --api-key, every route but /health and /ping needs the key (compared in constant time).

Clients send `Authorization: Bearer <key>`, as OpenAI clients do. A browser cannot add that
header to a page load, so the dashboard is opened once as /dashboard?api_key=<key>: the server
checks the key, answers with a cookie holding a token derived from it (HttpOnly, SameSite=Strict)
and redirects to the bare /dashboard. The cookie is accepted only on GET and HEAD, the read-only
requests the page makes, so a cross-site form cannot spend it on a completion.
"""

from __future__ import annotations

import hashlib
import hmac
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs

from starlette.responses import RedirectResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedllm.entrypoints.server.errors import error_response, unauthorized

OPEN_PATHS = frozenset({"/health", "/ping"})  # health checks
COOKIE = "pagedllm_session"
_READ_ONLY = frozenset({"GET", "HEAD"})


class APIKeyAuth:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()
        self._token = hmac.new(self._key, b"pagedllm dashboard session", hashlib.sha256).hexdigest().encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
        elif scope["path"] == "/dashboard" and self._matches(self._key, _query_key(scope)):
            await self._open_dashboard(scope, receive, send)
        else:
            await error_response(unauthorized())(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        headers = dict(scope["headers"])
        scheme, _, given = headers.get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and self._matches(self._key, given.strip()):
            return True
        return scope["method"] in _READ_ONLY and self._matches(self._token, _cookie(headers, COOKIE))

    @staticmethod
    def _matches(expected: bytes, given: bytes | None) -> bool:
        return given is not None and hmac.compare_digest(expected, given)

    async def _open_dashboard(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = RedirectResponse("/dashboard", status_code=303)
        response.set_cookie(COOKIE, self._token.decode(), httponly=True, samesite="strict", path="/")
        await response(scope, receive, send)


def _query_key(scope: Scope) -> bytes | None:
    values = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key")
    return values[0].encode() if values else None


def _cookie(headers: dict[bytes, bytes], name: str) -> bytes | None:
    raw = headers.get(b"cookie")
    if raw is None:
        return None
    cookies = SimpleCookie()
    try:
        cookies.load(raw.decode("latin-1"))
    except CookieError:  # a malformed Cookie header counts as none
        return None
    morsel = cookies.get(name)
    return morsel.value.encode() if morsel is not None else None
