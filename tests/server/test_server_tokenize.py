"""POST /tokenize and /detokenize (as vLLM's server answers them) and GET /version."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

import pagedllm
from server_harness import RunningServer

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture()
def http(server: RunningServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def test_a_prompt_counts_as_the_completion_counts_it(http: httpx.Client, server: RunningServer) -> None:
    got = http.post("/tokenize", json={"prompt": "paged attention", "return_token_strs": True}).json()
    tokenizer = server.async_engine.tokenizer
    assert got["tokens"] == tokenizer.encode("paged attention") and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == server.async_engine.max_model_len
    assert got["token_strs"] == tokenizer.convert_ids_to_tokens(got["tokens"])
    done = http.post("/v1/completions", json={"prompt": "paged attention", "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == got["count"]


def test_messages_count_as_the_chat_completion_counts_them(http: httpx.Client) -> None:
    got = http.post("/tokenize", json={"messages": MESSAGES}).json()
    assert got["token_strs"] is None
    done = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 1}).json()
    assert done["usage"]["prompt_tokens"] == got["count"] == len(got["tokens"])


def test_detokenize_gives_back_the_text(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": "blocks of sixteen", "add_special_tokens": False}).json()["tokens"]
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "blocks of sixteen"}


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {"prompt": "x", "messages": MESSAGES}, 400, None), ("/tokenize", {}, 400, None),
    ("/tokenize", {"prompt": "x", "model": "gpt-9"}, 404, "model"), ("/tokenize", {"prompt": ""}, 400, "prompt"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"), ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "model": "gpt-9"}, 404, "model"),
    ("/tokenize", {"messages": MESSAGES, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
    ("/tokenize", {"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools"),
    ("/tokenize", {"messages": MESSAGES, "mm_processor_kwargs": {"a": 1}}, 400, "mm_processor_kwargs"),
    ("/tokenize", {"prompt": "x", "media_io_kwargs": {}}, 400, "media_io_kwargs"),
])  # fmt: skip
def test_bad_requests_get_error_json(http: httpx.Client, path: str, body: dict, status: int, param: str | None) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"] and (param is None or error["param"] == param), error


def test_version(http: httpx.Client) -> None:
    assert http.get("/version").json() == {"version": pagedllm.__version__}


def test_messages_reach_the_template_as_a_chat_completions_do() -> None:
    from pagedllm.entrypoints.protocol import ChatCompletionRequest, TokenizeRequest

    fields = {"messages": MESSAGES, "documents": [{"title": "a"}], "reasoning_effort": "low",
              "chat_template_kwargs": {"x": 1}, "add_generation_prompt": False, "continue_final_message": True}
    assert TokenizeRequest(**fields).template_options() == ChatCompletionRequest(**fields).template_options()
