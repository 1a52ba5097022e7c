"""The lines of a server-sent event stream, split where the SSE format ends a line and nowhere else.

httpx's `aiter_lines` splits as `str.splitlines` does, also at U+2028, U+2029 and U+0085, which a server may
leave raw inside an event's JSON (a model's text can hold them): the event's line would arrive cut in two.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx

_LINE_END = re.compile(r"\r\n|\r|\n")  # the SSE format's line ends


async def sse_lines(response: httpx.Response) -> AsyncIterator[str]:
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        held_cr = buffer.endswith("\r")  # the first half of a CRLF, maybe
        *lines, buffer = _LINE_END.split(buffer[:-1] if held_cr else buffer)
        buffer += "\r" if held_cr else ""
        for line in lines:
            yield line
    if buffer.rstrip("\r"):
        yield buffer.rstrip("\r")
