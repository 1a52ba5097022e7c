"""The benchmark clients' SSE line reader splits at CRLF, LF and CR only, across chunk boundaries too."""

import asyncio

import httpx

from pagedllm.bench.sse_lines import sse_lines


class Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):
        for chunk in self.chunks:
            yield chunk


def lines_of(chunks: list[bytes]) -> list[str]:
    async def read() -> list[str]:
        return [line async for line in sse_lines(httpx.Response(200, stream=Chunks(chunks)))]

    return asyncio.run(read())


def test_line_ends_of_other_kinds_stay_inside_an_events_line():
    text = 'data: {"t":"a\u2028b\u2029c\x85d"}'
    assert lines_of([(text + "\n\ndata: [DONE]\n\n").encode()]) == [text, "", "data: [DONE]", ""]


def test_a_crlf_cut_between_chunks_ends_one_line():
    assert lines_of([b"data: 1\r", b"\ndata: 2\r", b"\r\n", b"data: 3"]) == ["data: 1", "data: 2", "", "data: 3"]


def test_a_character_cut_between_chunks_is_whole_in_its_line():
    encoded = "data: \u2028\u00e9\n".encode()
    assert lines_of([encoded[:7], encoded[7:9], encoded[9:]]) == ["data: \u2028\u00e9"]
