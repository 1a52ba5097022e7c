"""POST /reset_prefix_cache, as vLLM's, on the tiny model: the cache is emptied (a repeated prompt then finds no
prefix), refused while a running request's blocks are cached, and reset_running_requests is a 400."""

from __future__ import annotations

import time

import httpx
import pytest

from server_harness import start_server

PROMPT = list(range(5, 45))  # ten blocks of four
BODY = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine(real_config(tiny_llama_dir))
    server = start_server(engine)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield engine, client
    server.stop()


def hit_tokens(engine) -> int:
    return engine.stats().prefix_hits_tokens


def test_a_reset_empties_the_cache_and_a_repeated_prompt_finds_nothing(served):
    engine, http = served
    assert http.post("/v1/completions", json=BODY).status_code == 200
    before = hit_tokens(engine)
    assert http.post("/v1/completions", json=BODY).status_code == 200
    assert hit_tokens(engine) > before  # the second found the first's blocks
    assert http.post("/reset_prefix_cache").json() == {"success": True}
    assert engine.stats().blocks_cached_free == 0
    after_reset = hit_tokens(engine)
    assert http.post("/v1/completions", json=BODY).status_code == 200
    assert hit_tokens(engine) == after_reset
    assert http.post("/reset_prefix_cache", params={"reset_external": "true"}).json() == {"success": True}


def test_a_reset_is_refused_while_a_request_runs_and_reset_running_requests_is_a_400(served, monkeypatch):
    engine, http = served
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda: time.sleep(0.02) or step())  # 200 tokens take seconds
    body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()  # held: closing it would close the stream, and the server would abort
        next(line for line in lines if line.startswith("data: "))  # the request runs
        assert http.post("/reset_prefix_cache").json() == {"success": False}
        assert engine.stats().num_running == 1  # still running after the reset's answer
    refused = http.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
    assert refused.status_code == 400 and "reset_running_requests" in refused.json()["error"]["message"]
