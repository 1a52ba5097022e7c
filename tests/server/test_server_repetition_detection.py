"""vLLM's repetition_detection behind the server (tiny random model, greedy): an output that comes to repeat a
pattern ends there with finish_reason "repetition" and stop_reason "repetition_detected", whole or streamed, on
completions, chat and /v1/responses; bad params are a 400 naming the field."""

from __future__ import annotations

import random

import httpx
import pytest

from pagedllm.repetition_detection import RepetitionDetectionParams, ends_in_repetition
from server_harness import parse_stream, start_server

DETECT = {"max_pattern_size": 4, "min_count": 3}
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": 48, "return_token_ids": True}


@pytest.fixture(scope="module")
def http(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    server = start_server(LLMEngine(real_config(tiny_llama_dir)))
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client
    server.stop()


@pytest.fixture(scope="module")
def looping(http) -> tuple[list[int], list[int], int]:
    """A prompt the tiny model comes to repeat itself after, its free output, and where detection cuts it."""
    rng = random.Random(3)
    for _ in range(20):
        prompt = [rng.randrange(5, 384) for _ in range(rng.randint(3, 40))]
        free = http.post("/v1/completions", json={"prompt": prompt, **GREEDY}).json()["choices"][0]["token_ids"]
        detect = RepetitionDetectionParams(**DETECT)
        cut = next((k for k in range(1, len(free) + 1) if ends_in_repetition(free[:k], detect)), None)
        if cut is not None:
            return prompt, free, cut
    pytest.fail("no prompt of twenty made the tiny model repeat itself")


def test_completions_end_where_the_output_first_repeats(http, looping):
    prompt, free, cut = looping
    choice = http.post("/v1/completions", json={"prompt": prompt, "repetition_detection": DETECT,
                                                **GREEDY}).json()["choices"][0]
    assert choice["token_ids"] == free[:cut]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("repetition", "repetition_detected")
    response = http.post("/v1/completions", json={"prompt": prompt, "repetition_detection": DETECT, "stream": True,
                                                  **GREEDY})
    chunks, done = parse_stream(response.text.splitlines())
    streamed = [c["choices"][0] for c in chunks if c["choices"]]
    assert done
    assert sum((c["token_ids"] for c in streamed), []) == free[:cut]
    assert streamed[-1]["finish_reason"] == "repetition"


def test_chat_and_responses_take_it(http):
    detect = RepetitionDetectionParams(**DETECT)
    for content in ("hello there", "hi", "what is it?", "tell me more", "a b c", "why not", "go on", "is it?"):
        body = {"messages": [{"role": "user", "content": content}], **GREEDY}
        free = http.post("/v1/chat/completions", json=body).json()["choices"][0]["token_ids"]
        cut = next((k for k in range(1, len(free) + 1) if ends_in_repetition(free[:k], detect)), None)
        if cut is not None:
            break
    else:
        pytest.fail("none of these chats made the tiny model repeat itself")
    choice = http.post("/v1/chat/completions", json={**body, "repetition_detection": DETECT}).json()["choices"][0]
    assert choice["token_ids"] == free[:cut] and choice["finish_reason"] == "repetition"
    response = http.post("/v1/responses", json={"input": content, "max_output_tokens": 48, "temperature": 0,
                                                "ignore_eos": True, "repetition_detection": DETECT}).json()
    assert response["status"] == "completed" and response["usage"]["output_tokens"] == cut  # not cut by the limit


@pytest.mark.parametrize("value", [{"max_pattern_size": 2, "min_count": 1}, {"max_pattern_size": -1},
                                   {"pattern": 3}, [2, 3], {"max_pattern_size": 2000, "min_count": 2}])
def test_bad_params_are_a_400_naming_the_field(http, value):
    for path, body in (("/v1/completions", {"prompt": "hi"}), ("/v1/chat/completions", {"messages": [
            {"role": "user", "content": "hi"}]})):
        response = http.post(path, json={**body, "repetition_detection": value})
        assert response.status_code == 400, response.text
        assert "repetition_detection" in response.json()["error"]["message"]
