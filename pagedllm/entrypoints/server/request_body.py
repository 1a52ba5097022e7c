"""Request bodies parsed in a worker thread: strict JSON, valid Unicode, then the pydantic model.

Parsing a body near the size cap takes long enough to delay the event loop (and with it every
stream's next token), so it runs off the loop. The checks here are the ones no field type can
express: JSON's non-standard NaN / Infinity literals and strings that are not valid Unicode
(lone surrogates, which JSON's escapes can spell), which no tokenizer accepts.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from pagedllm.entrypoints.server.errors import APIError, validation_error

Body = TypeVar("Body", bound=BaseModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's body as `model`; an APIError (400, or 413 past the size cap) otherwise."""
    try:
        raw = await request.body()
    except ClientDisconnect:
        raise APIError(400, "the client disconnected before its body arrived") from None  # nobody reads it
    return await asyncio.to_thread(decode_body, raw, model)


def decode_body(raw: bytes, model: type[Body]) -> Body:
    data = _load_json(raw)
    _check_strings(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _reject_constant(name: str) -> float:
    raise APIError(400, f"malformed JSON body: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise APIError(400, f"malformed JSON body: the number {text[:40]} is out of range")
    return value


def _load_json(raw: bytes) -> Any:
    if not raw.strip():
        raise APIError(400, "malformed JSON body: the body is empty")
    try:
        # decoded here: json.loads would take UTF-16 and UTF-32 bodies too
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise APIError(400, "malformed JSON body: the body is not valid UTF-8") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise APIError(400, f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise APIError(400, "malformed JSON body: nested too deeply") from None
    except ValueError:  # an integer past Python's digit limit for int()
        raise APIError(400, "malformed JSON body: a number too long to read (more than 4300 digits)") from None


def _check_strings(data: Any) -> None:
    """Every string (keys included) must be valid Unicode; walks the document without recursion."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path)
                stack.append((item, f"{path}.{key}" if path else key))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}") for i, item in enumerate(value) if isinstance(item, (str, dict, list)))


def _check_text(text: str, path: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        param = path.split(".", 1)[0] or None
        where = f"{path} " if path else ""
        raise APIError(400, f"{where}contains a lone surrogate (\\ud800-\\udfff); text must be valid Unicode",
                       param=param) from None
