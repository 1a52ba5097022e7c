"""OpenAI-style error bodies, and the handlers that turn every failure into one.

Every invalid request gets {"error": {"message", "type", "param", "code"}} with a 4xx status;
FastAPI's 422 validation errors are folded into 400 so clients see what OpenAI would send.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pagedllm.engine.async_engine import RequestAborted
from pagedllm.entrypoints.protocol import NOT_TAKEN, ChatCompletionRequest, CompletionRequest
from pagedllm.entrypoints.responses_protocol import ResponsesRequest
from pagedllm.entrypoints.server import sse
from pagedllm.errors import UserFacingError

logger = logging.getLogger(__name__)

_KNOWN_PARAMS = set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields) | set(
    ResponsesRequest.model_fields) | set(NOT_TAKEN)
_LEADING_NAME = re.compile(r"^([a-z_]+)\b")
# how pydantic names a union's alternatives in an error's path: str, list[int], ContentPart (fields are snake_case)
_TYPE_NAME = re.compile(r"^(str|int|float|bool|[A-Z]\w*|\w+\[.*\])$")


class APIError(Exception):
    """An error with its HTTP status, raised by handlers and rendered as OpenAI error JSON."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | int | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(_body_of(error), status_code=error.status, headers=error.headers)


def _body_of(error: APIError) -> dict[str, Any]:
    return error_body(error.message, error.type, error.param, error.code)


def from_user_error(exc: UserFacingError) -> APIError:
    """A 400 for bad input; param guessed from the message's leading name (e.g. 'top_p must ...')."""
    message = str(exc)
    match = _LEADING_NAME.match(message)
    param = match.group(1) if match and match.group(1) in _KNOWN_PARAMS else None
    return APIError(400, message, param=param)


def model_not_found(name: str) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def overloaded() -> APIError:
    return APIError(503, "The server is overloaded: too many waiting requests; retry later.",
                    type_="server_overloaded", code="server_overloaded", headers={"Retry-After": "1"})


def from_abort(exc: RequestAborted) -> APIError:
    return APIError(503, str(exc), type_="service_unavailable", code="request_aborted")


def unauthorized() -> APIError:
    return APIError(401, "Missing or wrong API key: send this server's key as 'Authorization: Bearer <key>'.",
                    type_="authentication_error", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"})


def body_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body is larger than this server's limit of {limit} bytes "
                         "(--max-request-bytes).", code="request_too_large")


def validation_error(errors: Sequence[Any]) -> APIError:
    """The first of pydantic's (or FastAPI's) validation errors as a 400 naming its field."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return APIError(400, f"malformed JSON body: {first.get('msg')}")
    loc = _path(first)
    if not loc:
        return APIError(400, f"request body: {first.get('msg')}")
    param = next((p for p in loc if not p.isdigit()), loc[0])
    message = _union_message([e for e in errors if _path(e)[:1] == loc[:1]])
    return APIError(400, message or f"{'.'.join(loc)}: {first.get('msg')}", param=param)


def _path(error: Any) -> list[str]:
    loc = list(error.get("loc", ()))
    if loc[:1] == ["query"]:  # a query parameter's name follows
        loc = loc[1:]
    return [str(part) for part in loc if part != "body"]


def _union_message(errors: Sequence[Any]) -> str | None:
    """One field's errors from the alternatives of a type union (`stop`: a string or a list of strings), whose
    paths part at the alternatives' type names: the error of the one alternative the value's shape fits (a list
    of 33 stop strings: the list's length), or what was expected. None where the errors are no union's."""
    paths = [_path(e) for e in errors]
    at = next((i for i in range(min(map(len, paths))) if len({p[i] for p in paths}) > 1), None)
    if len(errors) < 2 or at is None or not all(_TYPE_NAME.match(p[at]) for p in paths):
        return None
    fits = [(p, e) for p, e in zip(paths, errors) if len(p) > at + 1 or not e.get("type", "").endswith("_type")]
    deepest = max((len(p) for p, _ in fits), default=0)
    best = [(p, e) for p, e in fits if len(p) == deepest]
    if len(best) == 1:
        path, error = best[0]
        return f"{'.'.join(path[:at] + path[at + 1:])}: {error.get('msg')}"
    alternatives = list(dict.fromkeys(p[at] for p in paths))
    expected = ", ".join(alternatives[:-1]) + f" or {alternatives[-1]}"
    return f"{'.'.join(paths[0][:at])}: expected {expected}"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc.errors()))

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(UserFacingError)
    async def on_user_error(request: Request, exc: UserFacingError) -> JSONResponse:
        return error_response(from_user_error(exc))

    @app.exception_handler(RequestAborted)
    async def on_aborted(request: Request, exc: RequestAborted) -> JSONResponse:
        return error_response(from_abort(exc))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, str(exc.detail), type_=type_,
                                       headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error in %s %s", request.method, request.url.path)
        return error_response(APIError(500, "internal server error", type_="internal_error"))


def sse_error(error: APIError) -> str:
    """An error event for a stream that has already started."""
    return sse.event(_body_of(error))
