"""Every invalid request gets an OpenAI-style error JSON with a 4xx status, never a 500."""

from __future__ import annotations

import httpx
import pytest

from server_harness import RunningServer

MSG = [{"role": "user", "content": "hi"}]

# (path, body, status, param or None when not checked)
CASES = [
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "n": 1000}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "n": True}, 400, "n"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": "word " * 400}, 400, None),
    ("/v1/completions", {"prompt": 42}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "logprobs": 99}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "stream": False, "stream_options": {"include_usage": True}}, 400, None),
    ("/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, "model"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "x"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": MSG, "max_completion_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "n": 1000}, 400, "n"),
    ("/v1/chat/completions", {"messages": MSG, "presence_penalty": 5}, 400, "presence_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 400}]}, 400, None),
    ("/v1/chat/completions", {"messages": MSG, "model": "nope"}, 404, "model"),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, None),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 1.0}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 1}, 400, None),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "suffix"),
]


@pytest.fixture(scope="module")
def http(server: RunningServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def assert_error_shape(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in response.text
    return error


@pytest.mark.parametrize("path,body,status,param", CASES, ids=[f"{c[0][4:]}:{c[1]}"[:60] for c in CASES])
def test_bad_request_gets_error_json(http: httpx.Client, path: str, body: dict, status: int,
                                     param: str | None) -> None:
    error = assert_error_shape(http.post(path, json=body), status)
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b"null"])
def test_malformed_body_is_400(http: httpx.Client, content: bytes) -> None:
    response = http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert_error_shape(response, 400)


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_error_shape(http.get("/v1/nothing"), 404)
    assert_error_shape(http.get("/v1/completions"), 405)
    assert_error_shape(http.get("/v1/models/not-served"), 404)


def test_no_request_left_behind(server: RunningServer) -> None:
    stats = server.wait_idle()
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)
