"""What each choice of a response or stream carries: its role and echo chunks, its logprobs once, one finish,
its place in prompt order; a prompt scored with echo ends by length; a stream left midway frees its request."""

from __future__ import annotations

import time

import httpx
import pytest
from conftest import fake_config
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, parse_stream, start_server

MSG = [{"role": "user", "content": "hi"}]
ROUTES = [("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": MSG})]


@pytest.fixture(scope="module")
def http(server: RunningServer):
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def events(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    chunks, done = parse_stream(response.text.splitlines())
    assert done, response.text[-200:]
    return chunks


def test_chat_logprobs_without_top_logprobs_give_the_sampled_tokens(http: httpx.Client) -> None:
    """As OpenAI: logprobs true alone gives each token's entry with top_logprobs []."""
    body = {"messages": MSG, "max_tokens": 3, "ignore_eos": True, "logprobs": True}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == response.json()["usage"]["completion_tokens"] == 3
    assert all(entry["top_logprobs"] == [] for entry in content)


def test_a_scored_prompt_ends_by_length_even_if_the_hidden_token_stops(http: httpx.Client) -> None:
    """echo with max_tokens 0 runs one token the response leaves out; a stop token there does not show."""
    body = {"prompt": "hello there", "max_tokens": 0, "echo": True, "logprobs": 1,
            "allowed_token_ids": [5], "stop_token_ids": [5]}  # fmt: skip
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("hello there", "length", None)


CONTINUED = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello, wor"}]
CONTINUE = {"messages": CONTINUED, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "add_generation_prompt": False, "continue_final_message": True}


def test_a_chat_echo_starts_each_answer_with_the_assistant_message_it_continues(http: httpx.Client) -> None:
    """As vLLM's echo: the last message's text, where it is the assistant's, comes first (as a chunk of its own
    after the role when streamed); the rest is the answer without echo."""
    plain = http.post("/v1/chat/completions", json=CONTINUE).json()["choices"][0]["message"]["content"]
    echoed = http.post("/v1/chat/completions", json=CONTINUE | {"echo": True, "n": 2}).json()["choices"]
    assert echoed[0]["message"]["content"] == "Hello, wor" + plain
    assert echoed[1]["message"]["content"].startswith("Hello, wor")
    chunks = events(http.post("/v1/chat/completions", json=CONTINUE | {"echo": True, "stream": True}))
    assert chunks[1]["choices"][0]["delta"] == {"content": "Hello, wor"}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == echoed[0][
        "message"]["content"]


def test_a_chat_echo_adds_nothing_after_a_user_message_and_joins_text_parts(http: httpx.Client) -> None:
    body = {"messages": MSG, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    plain = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert http.post("/v1/chat/completions", json=body | {"echo": True}).json()["choices"][0]["message"][
        "content"] == plain
    parts = [{"type": "text", "text": "Hello,"}, {"type": "text", "text": "wor"}]
    continued = CONTINUE | {"echo": True, "messages": [CONTINUED[0], {"role": "assistant", "content": parts}]}
    content = http.post("/v1/chat/completions", json=continued).json()["choices"][0]["message"]["content"]
    assert content.startswith("Hello,\nwor")


def test_choices_follow_the_prompts_order_not_their_finishing_order(server: RunningServer, http: httpx.Client) -> None:
    context = server.async_engine.max_model_len
    # max_tokens left out (16): the first prompt runs 16 tokens, the second only the 4 its context leaves
    body = {"prompt": [[5] * 3, [6] * (context - 4)], "logprobs": 1, "ignore_eos": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert [len(c["logprobs"]["tokens"]) for c in response.json()["choices"]] == [16, 4]


def test_a_streamed_echo_of_many_prompts_reaches_each_prompts_choices(http: httpx.Client) -> None:
    body = {"prompt": ["ab", "cd"], "n": 2, "max_tokens": 1, "echo": True, "stream": True, "temperature": 0}
    texts: dict[int, str] = {}
    for event in events(http.post("/v1/completions", json=body)):
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert sorted(texts) == [0, 1, 2, 3]
    assert all(text.startswith(["ab", "cd"][index // 2]) for index, text in texts.items()), texts


def test_a_chat_stream_opens_every_choice_with_its_role(http: httpx.Client) -> None:
    body = {"messages": MSG, "max_tokens": 2, "n": 3, "stream": True}
    roles = {c["index"] for e in events(http.post("/v1/chat/completions", json=body)) for c in e["choices"]
             if c["delta"].get("role") == "assistant"}
    assert roles == {0, 1, 2}


def test_a_chat_stream_sends_each_tokens_logprobs_once(http: httpx.Client) -> None:
    body = {"messages": MSG, "max_tokens": 3, "ignore_eos": True, "logprobs": True, "top_logprobs": 1,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    chunks = events(http.post("/v1/chat/completions", json=body))
    entries = sum(len((c.get("logprobs") or {}).get("content") or []) for e in chunks for c in e["choices"])
    assert entries == chunks[-1]["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("path,base", ROUTES)
def test_each_streamed_choice_finishes_once(http: httpx.Client, path: str, base: dict) -> None:
    body = {**base, "n": 4, "max_tokens": 24, "stop": [" ", "e"], "temperature": 1.0, "seed": 3, "stream": True}
    finishes: dict[int, int] = {}
    for event in events(http.post(path, json=body)):
        for choice in event["choices"]:
            if choice.get("finish_reason") is not None:
                finishes[choice["index"]] = finishes.get(choice["index"], 0) + 1
    assert finishes == {0: 1, 1: 1, 2: 1, 3: 1}


@pytest.fixture(scope="module")
def slow_server():
    running = start_server(FakeEngine(fake_config(), step_delay=0.05))  # 200 tokens: 10 s
    yield running
    running.stop()


@pytest.mark.parametrize("path,base", ROUTES)
def test_a_stream_left_midway_is_aborted_at_once(slow_server: RunningServer, path: str, base: dict) -> None:
    body = {**base, "max_tokens": 200, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=slow_server.base_url, timeout=30) as client:
        with client.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            next(line for line in response.iter_lines() if line.startswith("data: {"))  # it runs
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and slow_server.stats().num_running + slow_server.stats().num_waiting:
        time.sleep(0.05)
    stats = slow_server.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0, stats


def test_echoed_offsets_count_the_tokens_texts_through_the_prompt(http: httpx.Client) -> None:
    """Each text_offset is the last one plus its token's text, across the echoed prompt into the completion, even
    where tokens split a character (their texts then outnumber the prompt's characters)."""
    body = {"prompt": "Ελληνικά: Η γλώσσα 😀", "max_tokens": 3, "echo": True, "logprobs": 0, "ignore_eos": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    tokens, offsets = logprobs["tokens"], logprobs["text_offset"]
    assert offsets == [sum(map(len, tokens[:i])) for i in range(len(tokens))]


def test_usage_counts_every_prompts_tokens(http: httpx.Client) -> None:
    body = {"prompt": [[5] * 3, [6] * 7], "max_tokens": 2, "ignore_eos": True}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
