"""vLLM's thinking_token_budget behind the server (tiny random model, a deepseek_r1 reasoning parser and a forced end
of its own): the reasoning holds the model's first tokens and then the forced end, on chat, completions and
/v1/responses; a bad budget, or one on an engine without reasoning tags, is a 400."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from server_harness import start_server

FORCED = " Enough.</think>"
OPEN_THINKING = [{"role": "user", "content": "is it?"}, {"role": "assistant", "content": "<think>"}]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    config = dataclasses.replace(real_config(tiny_llama_dir), reasoning_parser="deepseek_r1",
                                 reasoning_config={"reasoning_end_str": FORCED})
    return LLMEngine(config)


@pytest.fixture(scope="module")
def http(engine):
    server = start_server(engine, chat_parsers=ChatParsers(reasoning_parser="deepseek_r1"))
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client
    server.stop()


def chat(http, **body):
    body = {"messages": OPEN_THINKING, "continue_final_message": True, "add_generation_prompt": False,
            "temperature": 0, "max_tokens": 24, "ignore_eos": True, "return_token_ids": True, **body}
    return http.post("/v1/chat/completions", json=body)


def forced_ids(engine) -> list[int]:
    return list(engine.output_stage.think_tags.forced_end)


@pytest.mark.parametrize("budget", [0, 4])
def test_chat_reasoning_is_the_models_tokens_up_to_the_budget_then_the_forced_end(http, engine, budget):
    free = chat(http).json()["choices"][0]
    assert "Enough." not in free["message"]["reasoning"]
    response = chat(http, thinking_token_budget=budget)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["token_ids"][:budget] == free["token_ids"][:budget]
    assert choice["token_ids"][budget:budget + len(forced_ids(engine))] == forced_ids(engine)
    assert choice["message"]["reasoning"].endswith(" Enough.")  # split where the forced </think> ends it
    assert choice["message"]["content"]  # the answer after it


def test_minus_one_and_null_are_no_budget(http):
    free = chat(http).json()["choices"][0]["token_ids"]
    for value in (-1, None):
        assert chat(http, thinking_token_budget=value).json()["choices"][0]["token_ids"] == free


def test_completions_and_responses_take_the_budget(http, engine):
    tokens = http.post("/tokenize", json={"messages": OPEN_THINKING, "continue_final_message": True,
                                          "add_generation_prompt": False}).json()["tokens"]
    body = {"prompt": tokens, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "thinking_token_budget": 2,
            "return_token_ids": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["token_ids"][2:2 + len(forced_ids(engine))] == forced_ids(engine)
    assert "Enough.</think>" in choice["text"]
    response = http.post("/v1/responses", json={"input": OPEN_THINKING[:1], "max_output_tokens": 40,
                                                "temperature": 0, "thinking_token_budget": 0})
    assert response.status_code == 200, response.text  # the tiny template leaves no block open: nothing forced
    bad = http.post("/v1/responses", json={"input": "hi", "thinking_token_budget": -3})
    assert bad.status_code == 400 and "thinking_token_budget" in bad.json()["error"]["message"]


@pytest.mark.parametrize("value", [-2, "3", 1.5, True])
def test_a_budget_that_is_not_an_integer_of_minus_one_or_more_is_a_400(http, value):
    response = chat(http, thinking_token_budget=value)
    assert response.status_code == 400
    assert "thinking_token_budget" in response.json()["error"]["message"]


def test_a_budget_on_an_engine_without_reasoning_tags_is_a_400_naming_the_options(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    server = start_server(LLMEngine(real_config(tiny_llama_dir)))
    try:
        response = httpx.post(f"{server.base_url}/v1/completions", timeout=60,
                              json={"prompt": "hi", "max_tokens": 4, "thinking_token_budget": 3})
        assert response.status_code == 400
        assert "--reasoning-parser" in response.json()["error"]["message"]
        assert httpx.get(f"{server.base_url}/v1/models").status_code == 200  # the server goes on
    finally:
        server.stop()
