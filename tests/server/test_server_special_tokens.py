"""A request's add_special_tokens reaches the tokenizer on every route, with vLLM's defaults: a completion's
text prompt gets the BOS unless told not to, a chat's messages only when asked (the template has its own), and
/tokenize does as the route it stands for. The echo shows the prompt text as sent, without that BOS."""

from __future__ import annotations

import httpx
import pytest
from conftest import fake_config
from fake_serving_engine import FakeEngine, FakeTokenizer
from server_harness import parse_stream, start_server

MSG = [{"role": "user", "content": "hi"}]
BOS = 2


class BosTokenizer(FakeTokenizer):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [BOS] * add_special_tokens + super().encode(text)


@pytest.fixture(scope="module")
def http():
    engine = FakeEngine(fake_config())
    engine.tokenizer = BosTokenizer()
    running = start_server(engine)
    with httpx.Client(base_url=running.base_url, timeout=30) as client:
        yield client
    running.stop()


def prompt_tokens(http: httpx.Client, path: str, body: dict) -> int:
    response = http.post(path, json={**body, "max_tokens": 1})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens"]


def test_a_completions_text_gets_the_bos_unless_told_not_to(http: httpx.Client) -> None:
    assert prompt_tokens(http, "/v1/completions", {"prompt": "hi"}) == 3
    assert prompt_tokens(http, "/v1/completions", {"prompt": "hi", "add_special_tokens": True}) == 3
    assert prompt_tokens(http, "/v1/completions", {"prompt": "hi", "add_special_tokens": False}) == 2


def test_a_chat_gets_the_bos_only_when_asked(http: httpx.Client) -> None:
    plain = prompt_tokens(http, "/v1/chat/completions", {"messages": MSG})
    assert prompt_tokens(http, "/v1/chat/completions", {"messages": MSG, "add_special_tokens": False}) == plain
    assert prompt_tokens(http, "/v1/chat/completions", {"messages": MSG, "add_special_tokens": True}) == plain + 1


def test_tokenize_follows_the_same_defaults(http: httpx.Client) -> None:
    def first(body: dict) -> int:
        response = http.post("/tokenize", json=body)
        assert response.status_code == 200, response.text
        return response.json()["tokens"][0]

    assert first({"prompt": "hi"}) == BOS
    assert first({"prompt": "hi", "add_special_tokens": False}) != BOS
    assert first({"messages": MSG}) != BOS
    assert first({"messages": MSG, "add_special_tokens": True}) == BOS


@pytest.mark.parametrize("stream", [False, True])
def test_the_echo_of_a_text_prompt_is_the_text_as_sent(http: httpx.Client, stream: bool) -> None:
    response = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1, "echo": True, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        chunks, _ = parse_stream(response.text.splitlines())
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    else:
        text = response.json()["choices"][0]["text"]
    assert text.startswith("hi"), text
