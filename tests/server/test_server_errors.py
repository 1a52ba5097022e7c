"""Every invalid request gets an OpenAI-style error JSON with a 4xx status, never a 500."""

from __future__ import annotations

import logging
import time

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
    ("/v1/chat/completions", {"messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": MSG, "n": 1000}, 400, "n"),
    ("/v1/chat/completions", {"messages": MSG, "presence_penalty": 5}, 400, "presence_penalty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x " * 400}]}, 400, None),
    ("/v1/chat/completions", {"messages": MSG, "model": "nope"}, 404, "model"),
    ("/v1/chat/completions", {"messages": MSG, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"five": 1.0}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1": 5, "01": -5}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": MSG, "chat_template_kwargs": {"tokenize": False}}, 400,
     "chat_template_kwargs"),
    # vLLM extras this server does not take are refused, not dropped as unknown fields
    ("/v1/chat/completions", {"messages": MSG, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
    ("/v1/chat/completions", {"messages": MSG, "echo": "yes"}, 400, "echo"),
    ("/v1/chat/completions", {"messages": MSG, "continue_final_message": True}, 400, "continue_final_message"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999": 1}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": MSG, "logit_bias": {"-3": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": MSG, "response_format": {"type": "structural_tag"}}, 400, "response_format"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_schema"}}, 400, "response_format"),
    ("/v1/completions", {"prompt": "x", "response_format": {"type": "json_object"}, "structured_outputs": {
        "regex": "a"}}, 400, "response_format"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"choice": []}}, 400, "structured_outputs"),
    ("/v1/chat/completions", {"messages": MSG, "structured_outputs": "a"}, 400, "structured_outputs"),
    ("/v1/chat/completions", {"messages": MSG, "guided_json": {"type": "object"}}, 400, "guided_json"),
    ("/v1/completions", {"prompt": "x", "guided_choice": ["a"]}, 400, "guided_choice"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": [10**6]}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("/v1/chat/completions", {"messages": MSG, "bad_words": [" "]}, 400, "bad_words"),
    ("/v1/completions", {"prompt": "x", "bad_words": "x"}, 400, "bad_words"),
    ("/v1/completions", {"prompt": "x", "logprob_token_ids": [5]}, 400, "logprob_token_ids"),
    ("/v1/chat/completions", {"messages": MSG, "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {"messages": MSG, "function_call": {"name": "f"}}, 400, "function_call"),
    ("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": 0}, 400, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "x", "truncate_prompt_tokens": 10**6}, 400, "truncate_prompt_tokens"),
    ("/v1/completions", {"prompt": "x", "truncation_side": "middle"}, 400, "truncation_side"),
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


HUGE_INTEGER = b'{"prompt": "x", "max_tokens": ' + b"1" * 5000 + b"}"  # past Python's 4300 digits for int()
UTF16 = '{"prompt": "x", "max_tokens": 2}'.encode("utf-16")  # json.loads alone would take it


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]", b"null", HUGE_INTEGER, UTF16],
                         ids=["not-json", "empty", "list", "null", "huge-integer", "utf-16"])
def test_malformed_body_is_400(http: httpx.Client, content: bytes) -> None:
    response = http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert_error_shape(response, 400)


# (body, words the message must hold): a field that takes one of several types says which fits
UNION_CASES = [
    ({"prompt": "x", "stop": ["s"] * 33}, "at most 32"),
    ({"prompt": "x", "stop": 5}, "expected str or list[str]"),
    ({"prompt": "x", "stop": [5]}, "stop.0: Input should be a valid string"),
    ({"prompt": [1.5]}, "expected str, list[int], list[str] or list[list[int]]"),
    ({"prompt": [[1, "a"]]}, "prompt.0.1: Input should be a valid integer"),
]


@pytest.mark.parametrize("body,words", UNION_CASES, ids=[w for _, w in UNION_CASES])
def test_union_fields_say_what_fits(http: httpx.Client, body: dict, words: str) -> None:
    error = assert_error_shape(http.post("/v1/completions", json=body), 400)
    assert words in error["message"] and error["param"] == next(iter(body.keys() - {"prompt"}), "prompt")


def test_chat_content_of_no_listed_type(http: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": 5}]}
    error = assert_error_shape(http.post("/v1/chat/completions", json=body), 400)
    assert error["param"] == "messages" and "expected str or list[ContentPart]" in error["message"]


def test_read_only_routes_answer_head(http: httpx.Client) -> None:
    for path in ("/health", "/v1/models", "/metrics", "/v1/kv", "/dashboard"):
        response = http.head(path)
        assert response.status_code == 200, path
        assert response.content == b""


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_error_shape(http.get("/v1/nothing"), 404)
    assert_error_shape(http.get("/v1/completions"), 405)
    assert_error_shape(http.get("/v1/models/not-served"), 404)


def test_no_request_left_behind(server: RunningServer) -> None:
    stats = server.wait_idle()
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)


def test_client_gone_before_its_body_is_no_server_error(server: RunningServer, http: httpx.Client,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b'Content-Length: 100\r\n\r\n{"prompt": ')
        time.sleep(0.2)
    time.sleep(0.5)
    assert http.get("/health").status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("path,base", [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": MSG})])
def test_unsupported_flags_sent_as_false_are_accepted(http: httpx.Client, path: str, base: dict) -> None:
    """Clients that send vLLM's defaults of the fields pagedllm lacks (null) are served."""
    response = http.post(path, json={**base, "max_tokens": 2, "use_beam_search": False, "logprob_token_ids": None,
                                     "guided_json": None})
    assert response.status_code == 200, response.text


def test_a_deeply_nested_body_is_400(http: httpx.Client) -> None:
    raw = '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"
    response = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert "nested" in assert_error_shape(response, 400)["message"]


@pytest.mark.parametrize("value", ['"x"', "1.0"])
def test_a_lone_surrogate_in_an_object_key_is_400(http: httpx.Client, value: str) -> None:
    raw = '{"prompt": "x", "max_tokens": 1, "logit_bias": {"\\ud800": %s}}' % value
    response = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert "surrogate" in assert_error_shape(response, 400)["message"]


def test_a_message_whose_first_word_is_no_field_names_no_param() -> None:
    from pagedllm.entrypoints.server.errors import from_user_error
    from pagedllm.errors import InvalidInputError

    error = from_user_error(InvalidInputError("request needs up to 600 KV blocks (4 x 600 tokens) but the pool has "
                                              "only 512; lower max_tokens or n, or give the engine more KV memory"))
    assert error.status == 400 and error.param is None
    assert from_user_error(InvalidInputError("top_p must be in (0, 1], got 2")).param == "top_p"


def test_of_two_bad_union_fields_the_first_is_named_alone() -> None:
    from pagedllm.entrypoints.protocol import CompletionRequest
    from pagedllm.entrypoints.server.errors import APIError
    from pagedllm.entrypoints.server.request_body import decode_body

    with pytest.raises(APIError) as info:
        decode_body(b'{"prompt": 5, "stop": 5}', CompletionRequest)
    assert (info.value.message, info.value.param) == ("stop: expected str or list[str]", "stop")


def test_a_wrong_method_says_which_are_allowed(http: httpx.Client) -> None:
    response = http.get("/v1/completions")
    assert_error_shape(response, 405)
    assert response.headers["allow"] == "POST"
