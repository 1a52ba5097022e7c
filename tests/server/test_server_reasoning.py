"""A reasoning parser behind the server (tiny random model; a regex makes it write a thinking answer): the message's
`reasoning` and `content`, streamed the same, `include_reasoning`, and tool calls looked for after the reasoning."""

from __future__ import annotations

import json

import httpx
import pytest

from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from server_harness import start_server

MESSAGES = [{"role": "user", "content": "is it?"}]
THINKING = r"<think>[a-z]{2,8} [a-z]{2,8}</think>\n\n(Yes|No)\."
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(tiny_llama_dir))


@pytest.fixture(scope="module")
def http(engine):
    server = start_server(engine, chat_parsers=ChatParsers("hermes", True, "qwen3"))
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client
    server.stop()


def chat(http, stream=False, **body):
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 60, "stream": stream, **body}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()
    chunks = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return [c["choices"][0] for c in chunks if c["choices"]]


def joined(choices, key):
    return "".join(c["delta"].get(key) or "" for c in choices)


def test_the_reasoning_is_split_from_the_answer_streamed_or_not(http):
    body = {"structured_outputs": {"regex": THINKING}, "logprobs": True}
    whole = chat(http, **body)
    message = whole["choices"][0]["message"]
    assert message["content"] in ("\n\nYes.", "\n\nNo.") and "<think>" not in message["reasoning"]
    assert " " in message["reasoning"] and whole["choices"][0]["finish_reason"] == "stop"
    streamed = chat(http, stream=True, **body)
    assert joined(streamed, "reasoning") == message["reasoning"] and joined(streamed, "content") == message["content"]
    logprobs = sum(len(c["logprobs"]["content"]) for c in streamed if c.get("logprobs"))
    assert logprobs == whole["usage"]["completion_tokens"]  # none lost while a tag was held


def test_include_reasoning_false_leaves_it_out(http):
    body = {"structured_outputs": {"regex": THINKING}, "include_reasoning": False}
    message = chat(http, **body)["choices"][0]["message"]
    assert message["reasoning"] is None and message["content"].startswith("\n\n")
    streamed = chat(http, stream=True, **body)
    assert joined(streamed, "reasoning") == "" and joined(streamed, "content") == message["content"]


def test_an_answer_without_thinking_is_all_content(http):
    message = chat(http, max_tokens=6)["choices"][0]["message"]
    assert message["reasoning"] is None and message["content"]


def test_tool_calls_are_found_after_the_reasoning(http):
    regex = r'<think>[a-z]{2,8}</think><tool_call>\{"name": "get_weather", "arguments": \{\}\}</tool_call>'
    body = {"tools": [WEATHER], "structured_outputs": {"regex": regex}, "max_tokens": 150}
    choice = chat(http, **body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["reasoning"] and choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    streamed = chat(http, stream=True, **body)
    assert joined(streamed, "reasoning") == choice["message"]["reasoning"]
    assert [e["function"]["name"] for c in streamed for e in c["delta"].get("tool_calls", [])] == ["get_weather"]


def test_deepseek_r1_answers_begin_in_reasoning(engine):
    server = start_server(engine, chat_parsers=ChatParsers(reasoning_parser="deepseek_r1"))
    try:
        with httpx.Client(base_url=server.base_url, timeout=60) as client:
            forced = chat(client, structured_outputs={"regex": r"[a-z]{3,6}</think>Yes\."})["choices"][0]["message"]
            cut = chat(client, max_tokens=4)["choices"][0]["message"]
    finally:
        server.stop()
    assert forced["content"] == "Yes." and 3 <= len(forced["reasoning"]) <= 6
    assert cut["content"] is None and cut["reasoning"]  # no </think>: all of it is reasoning
