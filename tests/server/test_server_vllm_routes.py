"""vLLM's GET /load (generating calls in flight) and GET /tokenizer_info (with --enable-tokenizer-info-endpoint),
and vLLM's server flags: request chat templates, default template kwargs, usage details, token names, CORS."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, start_server


@pytest.fixture(scope="module")
def slow() -> RunningServer:
    running = start_server(FakeEngine(fake_config(), step_delay=0.02))
    yield running
    running.stop()


def load(server: RunningServer) -> int:
    response = httpx.get(server.base_url + "/load", timeout=10)
    assert response.status_code == 200
    return response.json()["server_load"]


def read_stream(url: str, body: dict) -> None:
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        for _ in response.iter_lines():
            pass


def wait_for_load(server: RunningServer, count: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while load(server) != count and time.monotonic() < deadline:
        time.sleep(0.01)
    return load(server)


def test_load_counts_the_generating_calls_until_their_last_byte(slow: RunningServer) -> None:
    assert load(slow) == 0
    body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True, "ignore_eos": True}
    calls = [threading.Thread(target=httpx.post, args=(slow.base_url + "/v1/completions",),
                              kwargs={"json": body, "timeout": 30}),
             threading.Thread(target=read_stream, args=(slow.base_url + "/v1/chat/completions", chat))]
    for call in calls:
        call.start()
    assert wait_for_load(slow, 2) == 2  # the chat's stream counts until it ends
    httpx.post(slow.base_url + "/tokenize", json={"prompt": "hi"}, timeout=10)  # not a generating call
    assert load(slow) == 2
    for call in calls:
        call.join(30)
    assert wait_for_load(slow, 0) == 0


def test_a_refused_call_leaves_no_load(slow: RunningServer) -> None:
    refused = httpx.post(slow.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": -1}, timeout=10)
    assert refused.status_code == 400
    assert load(slow) == 0


def test_tokenizer_info_is_served_only_where_enabled(tiny_llama_dir) -> None:
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(real_config(tiny_llama_dir))
    plain = start_server(engine)
    try:
        assert httpx.get(plain.base_url + "/tokenizer_info", timeout=10).status_code == 404
    finally:
        plain.stop()
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    enabled = start_server(engine, enable_tokenizer_info=True, chat_template=template)
    try:
        info = httpx.get(enabled.base_url + "/tokenizer_info", timeout=10).json()
        assert info["tokenizer_class"] == type(engine.tokenizer).__name__
        assert info["chat_template"] == template
        assert "vocab_file" not in info and "merges_file" not in info
        for key, value in engine.tokenizer.init_kwargs.items():
            if key not in ("vocab_file", "merges_file", "chat_template") and isinstance(value, (str, int, bool)):
                assert info[key] == value, key
    finally:
        enabled.stop()


def test_a_trusted_request_brings_its_own_chat_template(tiny_llama_dir) -> None:
    """vLLM's --trust-request-chat-template: a chat's (and /tokenize's) chat_template renders its messages; one that
    does not compile is a 400 naming the field. (Untrusted, the field is a 400: test_server_errors.) With vLLM's
    --default-chat-template-kwargs, every chat's template kwargs start from those; the request's own win."""
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.errors import InvalidInputError

    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{{ flavour }}"
    engine = LLMEngine(real_config(tiny_llama_dir))
    with pytest.raises(InvalidInputError, match="--default-chat-template-kwargs may not set tokenize"):
        start_server(engine, default_chat_template_kwargs={"tokenize": True})
    trusting = start_server(engine, trust_request_chat_template=True,
                            default_chat_template_kwargs={"flavour": "|salt"})
    body = {"messages": [{"role": "user", "content": "hello"}], "chat_template": template}
    try:
        chat = httpx.post(trusting.base_url + "/v1/chat/completions", timeout=30,
                          json={**body, "max_tokens": 1, "return_prompt_text": True}).json()
        assert chat["prompt_text"] == "<user>hello|salt"
        own = httpx.post(trusting.base_url + "/v1/chat/completions", timeout=30, json={
            **body, "max_tokens": 1, "return_prompt_text": True, "chat_template_kwargs": {"flavour": "|pepper"}})
        assert own.json()["prompt_text"] == "<user>hello|pepper"
        tokens = httpx.post(trusting.base_url + "/tokenize", json=body, timeout=30).json()
        assert tokens["count"] == chat["usage"]["prompt_tokens"]
        plain = httpx.post(trusting.base_url + "/tokenize", json={"messages": body["messages"]}, timeout=30).json()
        assert plain["count"] != tokens["count"]  # the model's own template otherwise
        broken = httpx.post(trusting.base_url + "/v1/chat/completions", timeout=30,
                            json={**body, "chat_template": "{% for m in %}"})
        assert broken.status_code == 400 and broken.json()["error"]["param"] == "chat_template"
        assert "the request's chat template does not compile" in broken.json()["error"]["message"]
    finally:
        trusting.stop()


def test_the_serve_command_takes_the_flags() -> None:
    """`pagedllm serve` (on the fake engine) with the store, /tokenizer_info and every vLLM frontend flag it takes,
    which reach the API; a negative store size is refused before the engine loads."""
    import subprocess
    import sys
    from pathlib import Path

    from spawned_server import start_logged

    script = str(Path(__file__).parent / "serve_fake.py")
    base = [sys.executable, script, "--port", "0", "--num-blocks", "64", "--block-size", "4", "--max-model-len",
            "256", "--shutdown-timeout", "0.5"]
    refused = subprocess.run([*base, "--responses-store-size", "-1"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--responses-store-size must be >= 0" in refused.stderr
    proc, port, log = start_logged([*base, "--responses-store-size", "2", "--enable-tokenizer-info-endpoint",
                                    "--enable-server-load-tracking", "--trust-request-chat-template",
                                    "--default-chat-template-kwargs", '{"enable_thinking": false}',
                                    "--enable-prompt-tokens-details", "--enable-force-include-usage",
                                    "--return-tokens-as-token-ids", "--allowed-origins", '["*"]',
                                    "--enable-log-requests"],
                                   ready_timeout=30)
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/tokenizer_info", timeout=10).json()["tokenizer_class"] == "FakeTokenizer"
        first = httpx.post(url + "/v1/responses", json={"input": "hi", "max_output_tokens": 64}, timeout=30).json()
        assert httpx.get(f"{url}/v1/responses/{first['id']}", timeout=10).json() == first
        assert httpx.get(url + "/load", timeout=10).json() == {"server_load": 0}
        # the flags reach the API: CORS for any origin, usage details, token ids as names
        assert httpx.get(url + "/v1/models", headers={"Origin": "https://a.example"},
                         timeout=10).headers["access-control-allow-origin"] == "*"
        completion = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "logprobs": 0},
                                timeout=30).json()
        assert "cached_tokens" in completion["usage"]["prompt_tokens_details"]
        assert completion["choices"][0]["logprobs"]["tokens"][0].startswith("token_id:")
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_usage_and_token_name_flags(tiny_llama_dir) -> None:
    """vLLM's --enable-prompt-tokens-details (usage's cached prompt tokens), --enable-force-include-usage (every
    stream ends with its usage) and --return-tokens-as-token-ids (the requests' default)."""
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    server = start_server(LLMEngine(real_config(tiny_llama_dir)), enable_prompt_tokens_details=True,
                          enable_force_include_usage=True, return_tokens_as_token_ids=True)
    prompt = list(range(10, 60))
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "logprobs": 1}
    try:
        url = server.base_url
        first = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
        again = httpx.post(url + "/v1/completions", json=body, timeout=30).json()
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert 0 < again["usage"]["prompt_tokens_details"]["cached_tokens"] < len(prompt)
        assert all(t.startswith("token_id:") for t in again["choices"][0]["logprobs"]["tokens"])
        named = httpx.post(url + "/v1/completions", json={**body, "return_tokens_as_token_ids": False}, timeout=30)
        assert not any(t.startswith("token_id:") for t in named.json()["choices"][0]["logprobs"]["tokens"])
        chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=chat, timeout=30) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
        usage = json.loads(lines[-1][6:])["usage"]
        assert usage["completion_tokens"] == 2 and "cached_tokens" in usage["prompt_tokens_details"]
    finally:
        server.stop()


def test_allowed_origins_open_the_api_to_those_pages() -> None:
    """vLLM's --allowed-origins: a page there may call the API (its preflight needs no key; a refusal for want of
    one still carries the CORS headers, so the page can read it); none allowed, no CORS headers at all."""
    origin = {"Origin": "https://app.example"}
    preflight = {**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    opened = start_server(FakeEngine(fake_config()), api_key="k", allowed_origins=("https://app.example",))
    closed = start_server(FakeEngine(fake_config()), api_key="k")
    try:
        answer = httpx.options(opened.base_url + "/v1/chat/completions", headers=preflight, timeout=10)
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "https://app.example"
        models = httpx.get(opened.base_url + "/v1/models", headers={**origin, "Authorization": "Bearer k"}, timeout=10)
        assert models.status_code == 200 and models.headers["access-control-allow-origin"] == "https://app.example"
        refused = httpx.get(opened.base_url + "/v1/models", headers=origin, timeout=10)
        assert refused.status_code == 401 and "access-control-allow-origin" in refused.headers
        other = httpx.get(opened.base_url + "/v1/models", headers={"Origin": "https://elsewhere.example",
                                                                   "Authorization": "Bearer k"}, timeout=10)
        assert "access-control-allow-origin" not in other.headers
        plain = httpx.get(closed.base_url + "/v1/models", headers={**origin, "Authorization": "Bearer k"}, timeout=10)
        assert plain.status_code == 200 and "access-control-allow-origin" not in plain.headers
    finally:
        opened.stop()
        closed.stop()


def test_requests_are_logged_where_asked(slow: RunningServer, caplog) -> None:
    """The log --enable-log-requests opens: each admitted call's request ids, prompt lengths and parameters."""
    import logging

    with caplog.at_level(logging.INFO, logger="pagedllm.requests"):
        httpx.post(slow.base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "request_id": "seen"},
                   timeout=30)
    (record,) = [r for r in caplog.records if r.name == "pagedllm.requests"]
    assert "cmpl-seen" in record.getMessage() and "max_tokens=2" in record.getMessage()
