"""Structured outputs through the server, with the openai client: vLLM's `structured_outputs` on both endpoints
(streamed too), OpenAI's `response_format` json_object and json_schema on the default model, and a constraint
that does not compile as a 400."""

from __future__ import annotations

import json
import re

import openai
import pytest

from pagedllm.config import EngineConfig
from server_harness import start_server

CHOICES = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(tiny_llama_dir))


@pytest.fixture(scope="module")
def client(engine):
    server = start_server(engine)
    yield openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60), server.model
    server.stop()


def test_a_constraint_is_compiled_off_the_engine_thread_first(client, engine, monkeypatch):
    """The engine thread steps everyone's requests: a schema slow to compile must not hold it up. The server
    compiles it in a worker thread; the engine thread's own compile then finds it in xgrammar's cache."""
    import threading

    compile_once = engine.grammars.compile
    threads: list[str] = []

    def recording(params):
        threads.append(threading.current_thread().name)
        return compile_once(params)

    monkeypatch.setattr(engine.grammars, "compile", recording)
    api, model = client
    api.completions.create(model=model, prompt="id:", max_tokens=8,
                           extra_body={"structured_outputs": {"regex": "[0-9]{4}"}})  # fmt: skip
    assert len(threads) == 2 and threads[0] != "pagedllm-engine" and threads[1] == "pagedllm-engine"


def test_choices_and_regexes_hold_on_both_endpoints_streamed_or_not(client):
    api, model = client
    chat = dict(model=model, messages=[{"role": "user", "content": "colour?"}], max_tokens=30, n=3, seed=1,
                extra_body={"structured_outputs": {"choice": CHOICES}})  # fmt: skip
    for choice in api.chat.completions.create(**chat).choices:
        assert choice.message.content in CHOICES and choice.finish_reason == "stop"
    streamed = {}
    for chunk in api.chat.completions.create(**chat, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert len(streamed) == 3 and set(streamed.values()) <= set(CHOICES)
    plain = dict(model=model, prompt="id:", max_tokens=30, temperature=0.7, seed=2,
                 extra_body={"structured_outputs": {"regex": r"[a-f]{3}-\d\d"}})  # fmt: skip
    [choice] = api.completions.create(**plain).choices
    assert re.fullmatch(r"[a-f]{3}-\d\d", choice.text) and choice.finish_reason == "stop"


def test_a_constraint_that_does_not_compile_is_a_400_naming_it(client):
    api, model = client
    with pytest.raises(openai.BadRequestError) as caught:
        api.completions.create(model=model, prompt="x", extra_body={"structured_outputs": {"regex": "a(b"}})
    error = caught.value.body
    assert error["param"] == "structured_outputs" and "regex cannot be used" in error["message"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_response_format_json_schema_and_json_object_on_the_default_model(default_model_path) -> None:
    from pagedllm.engine.llm_engine import LLMEngine

    server = start_server(LLMEngine(EngineConfig(model=str(default_model_path), num_blocks=256, max_model_len=1024)))
    try:
        api = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                                   "languages": {"type": "array", "items": {"type": "string"},
                                                                 "maxItems": 3}},
                  "required": ["name", "languages"], "additionalProperties": False}  # fmt: skip
        messages = [{"role": "user", "content": "Describe a programmer as JSON."}]
        reply = api.chat.completions.create(
            model=server.model, messages=messages, temperature=0, max_tokens=150,
            response_format={"type": "json_schema", "json_schema": {"name": "programmer", "schema": schema}})
        value = json.loads(reply.choices[0].message.content)
        assert list(value) == ["name", "languages"] and len(value["name"]) <= 24
        assert isinstance(value["languages"], list) and len(value["languages"]) <= 3
        person = [{"role": "user", "content": "Give the name and age of a person as a JSON object."}]
        reply = api.chat.completions.create(model=server.model, messages=person, temperature=0, max_tokens=150,
                                            response_format={"type": "json_object"})  # fmt: skip
        content = reply.choices[0].message.content
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(content), dict)
        else:  # this small model may add keys until max_tokens (it does on the AMX Xeon, in float32 and bfloat16)
            assert reply.choices[0].finish_reason == "length" and content.startswith("{\n") and '"name":' in content
    finally:
        server.stop()
