"""Property: whatever body a client sends, the server answers below 500, every 4xx carries OpenAI's
error JSON, every 200 is a well-formed response or stream, and no request or block is left behind."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fake_config
from fake_serving_engine import FakeEngine
from pagedllm.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from pagedllm.entrypoints.responses_protocol import ResponsesRequest
from schema_strategies import request_bodies
from server_harness import RunningServer, start_server

MODEL = "fake-model"
ENDPOINTS = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatCompletionRequest,
             "/v1/responses": ResponsesRequest}
RESPONSES = "/v1/responses"  # its answer is a Response object, its stream typed events without [DONE]
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(FakeEngine(fake_config(served_model_name=MODEL), step_delay=0.0))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def check_error(text: str) -> None:
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error


def check_stream(path: str, lines: list[str]) -> None:
    data = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    if path == RESPONSES:
        events = [json.loads(d) for d in data]
        assert events and events[-1]["type"] in ("response.completed", "error"), lines[-3:]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        return
    assert data and data[-1] == "[DONE]", lines[-3:]
    for chunk in map(json.loads, data[:-1]):
        assert "choices" in chunk or "error" in chunk, chunk


def post(http: httpx.Client, path: str, content: bytes) -> None:
    headers = {"content-type": "application/json"}
    with http.stream("POST", path, content=content, headers=headers) as response:
        lines = list(response.iter_lines())
        assert response.status_code < 500, (response.status_code, lines[:3])
        if response.status_code >= 400:
            check_error("".join(lines))
        elif response.headers["content-type"].startswith("text/event-stream"):
            check_stream(path, lines)
        else:
            assert ("output" if path == RESPONSES else "choices") in json.loads("".join(lines))


def assert_nothing_left(server: RunningServer) -> None:
    engine = server.async_engine
    deadline = time.monotonic() + 10
    while (engine._streams or engine._engine.requests) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not engine._streams and not engine._engine.requests
    stats = server.wait_idle()
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
def test_any_body_gets_a_well_formed_answer(server: RunningServer, http: httpx.Client, path: str) -> None:
    schema = ENDPOINTS[path].model_json_schema()

    @SETTINGS
    @given(body=request_bodies(schema, MODEL))
    def check(body: dict) -> None:
        post(http, path, json.dumps(body).encode())
        assert_nothing_left(server)

    check()


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=40), st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")),
                     st.sampled_from([b"[]", b"null", b"1e999", b'{"prompt": NaN}', b"{" * 5000, b'"x"'])),
       path=st.sampled_from(sorted(ENDPOINTS)))
def test_any_bytes_get_a_well_formed_answer(server: RunningServer, http: httpx.Client, raw: bytes,
                                            path: str) -> None:
    post(http, path, raw)
    assert_nothing_left(server)
