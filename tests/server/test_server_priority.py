"""vLLM's `priority` on the three generating endpoints, on the tiny random model: taken by a server whose engine
runs scheduling_policy="priority", refused (400 naming the policy) by one that schedules first come, first
served; the engine tests (tests/engine/test_scheduler_priority.py) check the order itself."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from server_harness import start_server

MSG = [{"role": "user", "content": "hello there"}]
REQUESTS = [
    ("/v1/completions", {"prompt": [5, 17, 42], "max_tokens": 2}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2}),
    ("/v1/responses", {"input": "hello there", "max_output_tokens": 2}),
]


def client_for(tiny_llama_dir, policy: str):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    running = start_server(LLMEngine(replace(real_config(tiny_llama_dir), scheduling_policy=policy)))
    with httpx.Client(base_url=running.base_url, timeout=60) as client:
        yield client
    running.stop()


@pytest.fixture(scope="module")
def priority_http(tiny_llama_dir):
    yield from client_for(tiny_llama_dir, "priority")


@pytest.fixture(scope="module")
def fcfs_http(tiny_llama_dir):
    yield from client_for(tiny_llama_dir, "fcfs")


@pytest.mark.parametrize("path,body", REQUESTS)
def test_a_priority_server_takes_any_integer(priority_http, path, body):
    for priority in (-3, 0, 7, 2**63 - 1):
        response = priority_http.post(path, json={**body, "priority": priority})
        assert response.status_code == 200, response.text
    stream = priority_http.post(path, json={**body, "priority": 1, "stream": True})
    assert stream.status_code == 200
    assert stream.text.rstrip().endswith("data: [DONE]") or "event: response.completed" in stream.text


@pytest.mark.parametrize("path,body", REQUESTS)
def test_a_first_come_first_served_server_refuses_a_priority_other_than_0(fcfs_http, path, body):
    assert fcfs_http.post(path, json={**body, "priority": 0}).status_code == 200
    response = fcfs_http.post(path, json={**body, "priority": 2})
    assert response.status_code == 400
    assert "scheduling_policy 'priority'" in response.json()["error"]["message"]


@pytest.mark.parametrize("path,body", REQUESTS)
@pytest.mark.parametrize("bad", ["1", 1.5, True, 2**63])
def test_a_priority_that_is_not_a_64_bit_integer_is_a_400(priority_http, path, body, bad):
    response = priority_http.post(path, json={**body, "priority": bad})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "priority"


@pytest.mark.parametrize("path,body", REQUESTS)
def test_an_x_vllm_priority_header_that_reads_as_an_integer_overrides_the_body(fcfs_http, priority_http, path,
                                                                               body):
    refused = fcfs_http.post(path, json={**body, "priority": 0}, headers={"X-Vllm-Priority": "3"})
    assert refused.status_code == 400 and "scheduling_policy 'priority'" in refused.text
    assert fcfs_http.post(path, json={**body, "priority": 0}, headers={"X-Vllm-Priority": "high"}).status_code == 200
    assert fcfs_http.post(path, json={**body, "priority": 5}, headers={"X-Vllm-Priority": "0"}).status_code == 200
    assert priority_http.post(path, json=body, headers={"X-Vllm-Priority": "-2"}).status_code == 200
