"""A reasoning parser behind the server (tiny random model): the message's `reasoning` and `content`, streamed the
same with every token's logprobs, `include_reasoning`, and a request's constraint held after the reasoning. How
text splits (and where tool calls are looked for) is tested on given texts in test_reasoning.py."""

from __future__ import annotations

import json

import httpx
import pytest

from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from server_harness import start_server

MESSAGES = [{"role": "user", "content": "is it?"}]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(tiny_llama_dir))


@pytest.fixture()
def served(engine, request):
    """A server with the parametrized reasoning parser; the tiny template never opens <think> itself."""
    server = start_server(engine, chat_parsers=ChatParsers(reasoning_parser=request.param))
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client
    server.stop()


def chat(http, stream=False, **body):
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 12, "stream": stream, **body}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()
    chunks = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return [c["choices"][0] for c in chunks if c["choices"]]


def joined(choices, key):
    return "".join(c["delta"].get(key) or "" for c in choices)


@pytest.mark.parametrize("served", ["deepseek_r1"], indirect=True)
def test_an_answer_cut_short_in_its_reasoning_is_all_reasoning_streamed_or_not(served):
    whole = chat(served, logprobs=True)
    message = whole["choices"][0]["message"]
    assert message["reasoning"] and message["content"] is None and whole["choices"][0]["finish_reason"] == "length"
    streamed = chat(served, stream=True, logprobs=True)
    assert joined(streamed, "reasoning") == message["reasoning"] and joined(streamed, "content") == ""
    logprobs = sum(len(c["logprobs"]["content"]) for c in streamed if c.get("logprobs"))
    assert logprobs == whole["usage"]["completion_tokens"]  # none lost while a possible tag was held
    hidden = chat(served, include_reasoning=False)["choices"][0]["message"]
    assert hidden["reasoning"] is None and hidden["content"] is None
    assert joined(chat(served, stream=True, include_reasoning=False), "reasoning") == ""


@pytest.fixture()
def think_tokens(engine, monkeypatch):
    """The tiny vocabulary with <think> and </think> as tokens of their own, at ids the model never writes."""
    vocab = {**engine.tokenizer.get_vocab(), "<think>": 10**6, "</think>": 10**6 + 1}
    monkeypatch.setattr(engine.tokenizer, "get_vocab", lambda: vocab)


@pytest.mark.parametrize("served", ["deepseek_r1"], indirect=True)
def test_usage_counts_the_reasoning_tokens_where_the_tags_are_tokens(think_tokens, served):
    whole = chat(served, n=2, temperature=1.0, seed=1)["usage"]
    assert whole["completion_tokens_details"] == {"reasoning_tokens": whole["completion_tokens"]}  # all of it
    body = {"stream": True, "stream_options": {"include_usage": True}, "n": 2, "temperature": 1.0, "seed": 1}
    response = served.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 12, **body})
    *_, last = [json.loads(line[6:]) for line in response.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"]  # fmt: skip
    assert last["usage"] == whole


@pytest.mark.parametrize("served", ["qwen3"], indirect=True)
def test_an_answer_that_does_not_think_is_all_content(served):
    answer = chat(served)
    assert "completion_tokens_details" not in answer["usage"]  # the tiny vocabulary has no <think> token
    message = answer["choices"][0]["message"]
    assert message["reasoning"] is None and message["content"] and "<think>" not in message["content"]


@pytest.mark.parametrize("served,after", [("deepseek_r1", "open"), ("qwen3", "optional")], indirect=["served"])
def test_a_constraint_holds_after_the_reasoning(served, after, engine, monkeypatch):
    """vLLM starts a thinking model's constraint where its reasoning ends: here the grammar lets it think first."""
    compiled = []
    compile_constraint = engine.compile_constraint
    monkeypatch.setattr(engine, "compile_constraint", lambda p: compiled.append(p) or compile_constraint(p))
    body = {"structured_outputs": {"choice": ["Yes", "No"]}}
    choice = chat(served, **body)["choices"][0]
    assert {p.structured_outputs.after_reasoning for p in compiled} == {after}
    if after == "open":  # the answer begins in the reasoning: 12 tokens of it, not "Yes" at once
        assert choice["finish_reason"] == "length" and choice["message"]["reasoning"]
    tools = {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "required"}
    compiled.clear()
    chat(served, **tools)
    assert [p.structured_outputs.after_reasoning for p in compiled] == [after] * len(compiled) and compiled
