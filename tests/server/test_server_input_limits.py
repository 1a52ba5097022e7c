"""Hostile input is a 4xx with OpenAI's error JSON in the project's words, never a 500.

Lone surrogates, NaN / Infinity literals, numbers past float range, token ids past the
vocabulary, an empty cache salt, best_of, and prompt + max_tokens past the model's context.
"""

from __future__ import annotations

import httpx
import pytest

from pagedllm.entrypoints.protocol import MAX_PROMPTS, MAX_STOP_STRINGS
from server_harness import RunningServer

MSG = [{"role": "user", "content": "hi"}]
LIBRARY_WORDS = ("TextEncodeInput", "Union[", "pydantic", "Traceback", "jinja")

# (path, raw JSON body, param or None when not checked)
RAW_CASES = [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 4}', "prompt"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"], "max_tokens": 4}', "prompt"),
    ("/v1/completions", '{"prompt": "x", "stop": ["\\ud83d"]}', "stop"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}', "messages"),
    ("/v1/completions", '{"prompt": "x", "temperature": Infinity}', None),
    ("/v1/completions", '{"prompt": "x", "temperature": NaN}', None),
    ("/v1/completions", '{"prompt": "x", "top_p": -Infinity}', None),
    ("/v1/completions", '{"prompt": "x", "temperature": 1e999}', None),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}', None),
]


def cases(context: int) -> list[tuple[str, dict, str | None]]:
    return [
        ("/v1/completions", {"prompt": "x", "temperature": 1e308}, "temperature"),
        ("/v1/completions", {"prompt": "x", "temperature": 1e-300}, "temperature"),
        ("/v1/completions", {"prompt": "x", "repetition_penalty": 1e308}, "repetition_penalty"),
        ("/v1/completions", {"prompt": "x", "repetition_penalty": 1e-300}, "repetition_penalty"),
        ("/v1/completions", {"prompt": "x", "best_of": 3}, "best_of"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**9]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": "x", "min_tokens": 2, "stop_token_ids": [10**30]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": [1, 2, 10**9]}, "prompt"),
        ("/v1/completions", {"prompt": [[1, 2], [-5]]}, "prompt"),
        ("/v1/completions", {"prompt": "x", "top_k": 10**30}, "top_k"),
        ("/v1/completions", {"prompt": "x", "seed": 2**64}, "seed"),
        ("/v1/completions", {"prompt": "x", "cache_salt": ""}, "cache_salt"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 10**9}, "max_tokens"),
        ("/v1/completions", {"prompt": [1] * 10, "max_tokens": context}, "max_tokens"),
        ("/v1/chat/completions", {"messages": MSG, "max_tokens": 10**9}, "max_tokens"),
        ("/v1/chat/completions", {"messages": MSG, "max_completion_tokens": context}, "max_completion_tokens"),
        ("/v1/chat/completions", {"messages": MSG, "stop_token_ids": [10**9]}, "stop_token_ids"),
        ("/v1/chat/completions", {"messages": MSG, "cache_salt": ""}, "cache_salt"),
        ("/v1/chat/completions", {"messages": MSG, "functions": [{"name": "f"}]}, "functions"),
        ("/v1/completions", {"prompt": "x", "stop": [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]}, "stop"),
        ("/v1/completions", {"prompt": ["a"] * (MAX_PROMPTS + 1), "max_tokens": 1}, "prompt"),
    ]


@pytest.fixture(scope="module")
def http(server: RunningServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def assert_4xx(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert not any(word in response.text for word in LIBRARY_WORDS), response.text
    return error


@pytest.mark.parametrize("path,raw,param", RAW_CASES, ids=[c[1][:50] for c in RAW_CASES])
def test_invalid_text_and_numbers_are_400(http: httpx.Client, path: str, raw: str, param: str | None) -> None:
    error = assert_4xx(http.post(path, content=raw, headers={"content-type": "application/json"}))
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.parametrize("index", range(len(cases(0))))
def test_out_of_range_fields_are_400(server: RunningServer, http: httpx.Client, index: int) -> None:
    path, body, param = cases(server.async_engine.max_model_len)[index]
    error = assert_4xx(http.post(path, json=body))
    assert error["param"] == param, error


def test_invalid_utf8_body_is_400(http: httpx.Client) -> None:
    raw = b'{"prompt": "\xff\xfe", "max_tokens": 2}'
    assert_4xx(http.post("/v1/completions", content=raw, headers={"content-type": "application/json"}))


def test_past_the_context_names_both_numbers(server: RunningServer, http: httpx.Client) -> None:
    context = server.async_engine.max_model_len
    prompt = [5] * (context - 10)
    error = assert_4xx(http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 11}))
    assert str(context) in error["message"] and str(len(prompt) + 11) in error["message"], error


def test_explicit_max_tokens_that_fits_is_served_in_full(server: RunningServer, http: httpx.Client) -> None:
    context = server.async_engine.max_model_len
    prompt = [5] * (context - 10)
    body = {"prompt": prompt, "max_tokens": 10, "ignore_eos": True, "temperature": 0}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 10


def test_missing_max_tokens_runs_up_to_the_context(server: RunningServer, http: httpx.Client) -> None:
    context = server.async_engine.max_model_len
    body = {"messages": MSG, "ignore_eos": True, "temperature": 0}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == context
    assert response.json()["choices"][0]["finish_reason"] == "length"


def test_best_of_equal_to_n_is_accepted(http: httpx.Client, server: RunningServer) -> None:
    body = {"model": server.model, "prompt": "x", "n": 2, "best_of": 2, "max_tokens": 3}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 2


def test_nothing_left_behind(server: RunningServer) -> None:
    stats = server.wait_idle()
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)


def test_the_first_id_past_the_vocabulary_is_refused(server: RunningServer, http: httpx.Client) -> None:
    vocab = server.async_engine.vocab_size
    assert assert_4xx(http.post("/detokenize", json={"tokens": [1, vocab]}))["param"] == "tokens"
    assert http.post("/detokenize", json={"tokens": [1, vocab - 1]}).status_code == 200


def test_a_prompt_that_fills_the_context_is_refused(server: RunningServer, http: httpx.Client) -> None:
    context = server.async_engine.max_model_len
    error = assert_4xx(http.post("/v1/completions", json={"prompt": [5] * context}))
    assert error["param"] == "prompt" and f"the prompt alone has {context}" in error["message"], error


def test_prompt_ids_are_checked_before_truncation(server: RunningServer, http: httpx.Client) -> None:
    vocab = server.async_engine.vocab_size
    body = {"prompt": [vocab + 5, 1, 2, 3], "truncate_prompt_tokens": 2, "max_tokens": 1}
    assert assert_4xx(http.post("/v1/completions", json=body))["param"] == "prompt"


def test_max_tokens_left_out_is_shortened_near_the_context(server: RunningServer, http: httpx.Client) -> None:
    """OpenAI's default of 16 is not the client's: it is cut to what the context leaves, not refused."""
    context = server.async_engine.max_model_len
    response = http.post("/v1/completions", json={"prompt": [5] * (context - 5), "ignore_eos": True})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 5
    assert response.json()["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("key", ["²", "١"])  # digits to str.isdigit, not ASCII ones ("١" would even parse as 1)
def test_a_logit_bias_key_of_other_digits_is_400(http: httpx.Client, key: str) -> None:
    body = {"prompt": "x", "max_tokens": 1, "logit_bias": {key: 1.0}}
    assert assert_4xx(http.post("/v1/completions", json=body))["param"] == "logit_bias"


def test_negative_token_ids_are_refused(http: httpx.Client) -> None:
    assert assert_4xx(http.post("/detokenize", json={"tokens": [-1]}))["param"] == "tokens"
    body = {"prompt": "x", "max_tokens": 1, "stop_token_ids": [-1]}
    assert assert_4xx(http.post("/v1/completions", json=body))["param"] == "stop_token_ids"


def test_top_k_may_be_the_vocabulary_size(server: RunningServer, http: httpx.Client) -> None:
    body = {"prompt": "x", "max_tokens": 1, "top_k": server.async_engine.vocab_size}
    assert http.post("/v1/completions", json=body).status_code == 200
