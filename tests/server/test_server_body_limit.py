"""--max-request-bytes: a larger body is a 413 before anything parses it, declared or chunked."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, start_server

CAP = 4096


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(FakeEngine(fake_config()), max_request_bytes=CAP)
    yield running
    running.stop()


@pytest.fixture()
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def body_of_size(size: int) -> bytes:
    """A completion body of exactly `size` bytes (a short prompt padded by an ignored field)."""
    head = json.dumps({"prompt": "hi", "max_tokens": 2, "user": ""}).encode()
    body = head[:-2] + b"x" * (size - len(head)) + head[-2:]
    assert len(body) == size
    return body


def assert_413(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and str(CAP) in error["message"]


def test_body_at_the_cap_is_served(http: httpx.Client) -> None:
    response = http.post("/v1/completions", content=body_of_size(CAP))
    assert response.status_code == 200, response.text


def test_declared_length_past_the_cap_is_413(http: httpx.Client) -> None:
    assert_413(http.post("/v1/completions", content=body_of_size(CAP + 1)))


def test_past_the_cap_is_413_even_when_malformed(http: httpx.Client) -> None:
    assert_413(http.post("/v1/chat/completions", content=b"{" * (CAP + 1)))


def test_chunked_body_past_the_cap_is_413(http: httpx.Client) -> None:
    body = body_of_size(CAP + 100)

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 1000):
            yield body[start:start + 1000]

    request = http.build_request("POST", "/v1/completions", content=chunks())
    assert "content-length" not in request.headers
    assert_413(http.send(request))


def test_chunked_body_within_the_cap_is_served(http: httpx.Client) -> None:
    body = body_of_size(CAP)
    request = http.build_request("POST", "/v1/completions", content=iter([body[:100], body[100:]]))
    assert http.send(request).status_code == 200


def test_nothing_left_behind(server: RunningServer) -> None:
    stats = server.wait_idle()
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)
