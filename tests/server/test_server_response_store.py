"""Stored responses (--responses-store-size): `store`, `previous_response_id`, GET /v1/responses/{id}, and background
runs with their cancel. On the fake engine, whose byte-level chat template makes a prompt's token count its text's
length; on the tiny model, a continued response gives the chat path's answer to the whole conversation."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, start_server

GREEDY = {"temperature": 0, "max_output_tokens": 64}  # the fake engine's answers end by themselves (48 tokens)


@pytest.fixture(scope="module")
def stored() -> RunningServer:
    running = start_server(FakeEngine(fake_config()), responses_store_size=3)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def slow() -> RunningServer:
    """Slow steps, so that a background response is still running when it is cancelled."""
    running = start_server(FakeEngine(fake_config(), step_delay=0.05), responses_store_size=4)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def unstored() -> RunningServer:
    running = start_server(FakeEngine(fake_config()))
    yield running
    running.stop()


def create(server: RunningServer, **body) -> httpx.Response:
    return httpx.post(server.base_url + "/v1/responses", json=body, timeout=30)


def retrieve(server: RunningServer, response_id: str, **params) -> httpx.Response:
    return httpx.get(f"{server.base_url}/v1/responses/{response_id}", params=params, timeout=30)


def cancel(server: RunningServer, response_id: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/responses/{response_id}/cancel", timeout=30)


def answer(response: dict) -> str:
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"])


def test_a_stored_response_is_given_back_by_id(stored: RunningServer) -> None:
    made = create(stored, input="hi", **GREEDY).json()
    assert made["store"] is True and made["status"] == "completed" and made["previous_response_id"] is None
    got = retrieve(stored, made["id"])
    assert got.status_code == 200 and got.json() == made


def test_a_continued_response_sees_the_stored_conversation_and_not_its_instructions(stored: RunningServer) -> None:
    first = create(stored, input="hi", instructions="be brief", **GREEDY).json()
    second = create(stored, input="more", previous_response_id=first["id"], **GREEDY).json()
    assert second["previous_response_id"] == first["id"]
    # the fake template: "<role>content\n" per message, then "<assistant>"; a token a byte
    conversation = f"<user>hi\n<assistant>{answer(first)}\n<user>more\n<assistant>"
    assert second["usage"]["input_tokens"] == len(conversation.encode())
    third = create(stored, input=[{"role": "user", "content": "again"}], instructions="now",
                   previous_response_id=second["id"], **GREEDY).json()
    conversation = f"<system>now\n{conversation}{answer(second)}\n<user>again\n<assistant>"
    assert third["usage"]["input_tokens"] == len(conversation.encode())


def test_store_false_keeps_a_response_out(stored: RunningServer) -> None:
    made = create(stored, input="hi", store=False, **GREEDY).json()
    assert made["store"] is False
    assert retrieve(stored, made["id"]).status_code == 404
    missing = create(stored, input="more", previous_response_id=made["id"], **GREEDY)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "previous_response_id"


def test_the_least_recently_used_response_goes_first() -> None:
    server = start_server(FakeEngine(fake_config()), responses_store_size=2)
    try:
        ids = [create(server, input=f"q{i}", **GREEDY).json()["id"] for i in range(2)]
        assert retrieve(server, ids[0]).status_code == 200  # ids[1] is now the least recently used
        ids.append(create(server, input="q2", **GREEDY).json()["id"])
        assert [retrieve(server, i).status_code for i in ids] == [200, 404, 200]
    finally:
        server.stop()


def test_a_streamed_response_is_stored_as_completed(stored: RunningServer) -> None:
    with httpx.stream("POST", stored.base_url + "/v1/responses", json={"input": "hi", "stream": True, **GREEDY},
                      timeout=30) as response:
        lines = list(response.iter_lines())
    completed = [line for line in lines if line.startswith("data: ") and '"response.completed"' in line]
    assert len(completed) == 1
    final = json.loads(completed[0][len("data: "):])["response"]
    assert final["store"] is True and retrieve(stored, final["id"]).json() == final


def test_a_background_response_answers_queued_and_runs_to_the_foreground_answer(stored: RunningServer) -> None:
    made = create(stored, input="hi", background=True, **GREEDY).json()
    assert made["status"] == "queued" and made["background"] is True and made["output"] == []
    done = poll(stored, made["id"])
    assert done["status"] == "completed" and done["background"] is True
    assert answer(done) == answer(create(stored, input="hi", **GREEDY).json())
    assert stored.wait_idle().blocks_used == 0


def test_cancel_stops_a_background_response_and_frees_its_blocks(slow: RunningServer) -> None:
    made = create(slow, input="hi", background=True, temperature=0, max_output_tokens=200, ignore_eos=True).json()
    time.sleep(0.2)
    cancelled = cancel(slow, made["id"])
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert retrieve(slow, made["id"]).json()["status"] == "cancelled"
    stats = slow.wait_idle()
    assert stats.num_running == 0 and stats.blocks_used == 0
    again = cancel(slow, made["id"])
    assert again.status_code == 400 and again.json()["error"]["param"] == "response_id"


def test_a_running_response_cannot_be_continued_and_a_finished_one_not_cancelled(slow: RunningServer) -> None:
    made = create(slow, input="hi", background=True, temperature=0, max_output_tokens=200, ignore_eos=True).json()
    early = create(slow, input="more", previous_response_id=made["id"], **GREEDY)
    assert early.status_code == 400 and early.json()["error"]["param"] == "previous_response_id"
    assert cancel(slow, made["id"]).status_code == 200
    finished = create(slow, input="hi", **GREEDY).json()
    refused = cancel(slow, finished["id"])
    assert refused.status_code == 400 and "completed" in refused.json()["error"]["message"]


@pytest.mark.parametrize("body,param", [
    ({"background": True, "store": False}, "background"),
    ({"background": True, "stream": True}, "background"),
    ({"previous_response_id": "resp_nope"}, "previous_response_id")])
def test_what_the_store_cannot_do_is_an_error_naming_it(stored: RunningServer, body: dict, param: str) -> None:
    response = create(stored, input="hi", **body)
    assert response.status_code in (400, 404) and response.json()["error"]["param"] == param
    assert stored.wait_idle().num_running == 0


def test_without_a_store_nothing_is_kept(unstored: RunningServer) -> None:
    made = create(unstored, input="hi", **GREEDY).json()
    assert made["store"] is False
    missing = retrieve(unstored, made["id"])
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert cancel(unstored, made["id"]).status_code == 404
    for field in ("previous_response_id", "background"):
        refused = create(unstored, input="hi", **{field: "resp_1" if field == "previous_response_id" else True})
        assert refused.status_code == 400 and "--responses-store-size" in refused.json()["error"]["message"]


def test_a_stored_response_is_not_streamed_again(stored: RunningServer) -> None:
    made = create(stored, input="hi", **GREEDY).json()
    refused = retrieve(stored, made["id"], stream="true")
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


def test_a_continued_response_is_the_chats_answer_to_the_whole_conversation(tiny_llama_dir) -> None:
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    server = start_server(LLMEngine(real_config(tiny_llama_dir)), responses_store_size=4)
    try:
        first = create(server, input="hello there", temperature=0, max_output_tokens=8).json()
        second = create(server, input="and then?", previous_response_id=first["id"], temperature=0,
                        max_output_tokens=8).json()
        messages = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": answer(first)},
                    {"role": "user", "content": "and then?"}]
        chat = httpx.post(server.base_url + "/v1/chat/completions", timeout=30,
                          json={"messages": messages, "temperature": 0, "max_tokens": 8}).json()
        assert answer(second) == chat["choices"][0]["message"]["content"]
        assert second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    finally:
        server.stop()


def poll(server: RunningServer, response_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = retrieve(server, response_id).json()
        if response["status"] not in ("queued", "in_progress"):
            return response
        time.sleep(0.02)
    raise AssertionError(f"{response_id} still running after {timeout} s")


def test_the_openai_client_continues_retrieves_and_cancels(slow: RunningServer) -> None:
    import openai

    api = openai.OpenAI(base_url=slow.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    first = api.responses.create(model=slow.model, input="hi", **GREEDY)
    second = api.responses.create(model=slow.model, input="more", previous_response_id=first.id, **GREEDY)
    assert api.responses.retrieve(second.id).output_text == second.output_text
    assert second.previous_response_id == first.id and second.store is True
    queued = api.responses.create(model=slow.model, input="hi", background=True, temperature=0,
                                  max_output_tokens=200, extra_body={"ignore_eos": True})
    assert queued.status == "queued" and queued.background is True
    assert api.responses.cancel(queued.id).status == "cancelled"
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve("resp_unknown")
