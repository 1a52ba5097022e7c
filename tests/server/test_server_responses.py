"""POST /v1/responses through the server with the openai client, on a tiny random model: the answer is the chat
path's for the same messages, a stream's events come in vLLM's order and join to the whole response, and what the
endpoint cannot honour is a 400 naming the field."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import openai
import pytest

from pagedllm.engine.async_engine import RequestAborted
from pagedllm.entrypoints.responses_protocol import ResponsesRequest
from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from pagedllm.entrypoints.server.chat_text import ChatText
from pagedllm.entrypoints.server.responses import _Events, _View
from pagedllm.errors import InvalidInputError
from server_harness import RunningServer, start_server

GREEDY = {"temperature": 0, "max_output_tokens": 8}
CITIES = ["Oslo", "Paris", "Rome"]
WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                          "required": ["city"], "additionalProperties": False}}
CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
# the plain server only: this random model never ends a reasoning block, after which a call would come
PLAIN = pytest.mark.parametrize("server", [None], ids=["plain"], indirect=True)
LOGPROBS = "message.output_text.logprobs"
MESSAGE_EVENTS = ["response.output_item.added", "response.content_part.added", "response.output_text.done",
                  "response.content_part.done", "response.output_item.done"]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(tiny_llama_dir))


@pytest.fixture(scope="module", params=[None, "deepseek_r1"], ids=["plain", "reasoning"])
def server(engine, request) -> RunningServer:
    """Served plainly, and with a reasoning parser that opens every answer in reasoning (this random model never
    closes it: the answer is a reasoning item and an empty message)."""
    running = start_server(engine, chat_parsers=ChatParsers(reasoning_parser=request.param))
    running.reasoning = request.param is not None
    yield running
    running.stop()


@pytest.fixture(scope="module")
def api(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def texts(response) -> tuple[str, str | None]:
    """(the message's text, the reasoning item's text or None) of a Response object."""
    message = [item for item in response.output if item.type == "message"]
    reasoning = [item for item in response.output if item.type == "reasoning"]
    assert len(message) == 1 and len(reasoning) <= 1 and response.output[-1].type == "message"
    return message[0].content[0].text, reasoning[0].content[0].text if reasoning else None


def test_a_response_is_the_chat_answer_to_the_same_messages(api: openai.OpenAI, server: RunningServer) -> None:
    response = api.responses.create(model=server.model, input="hello there", instructions="Be brief.", **GREEDY)
    chat = api.chat.completions.create(model=server.model, temperature=0, max_tokens=8, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}])
    message, reasoning = texts(response)
    assert (message, reasoning) == ((chat.choices[0].message.content or ""),
                                    getattr(chat.choices[0].message, "reasoning", None))
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens, 8)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.id.startswith("resp_") and response.instructions == "Be brief."


def test_message_items_with_text_parts_read_as_chat_messages(api: openai.OpenAI, server: RunningServer) -> None:
    conversation = [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello",
                                                                          "annotations": []}]},
                    {"role": "user", "content": "and then?"}]
    response = api.responses.create(model=server.model, input=conversation, **GREEDY)
    chat = api.chat.completions.create(model=server.model, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and then?"}])
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert texts(response)[0] == (chat.choices[0].message.content or "")


def test_a_stream_sends_vllms_events_and_joins_to_the_whole_response(api: openai.OpenAI,
                                                                     server: RunningServer) -> None:
    whole = api.responses.create(model=server.model, input="hello there", **GREEDY)
    events = list(api.responses.create(model=server.model, input="hello there", stream=True, **GREEDY))
    names = [e.type for e in events]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    joined = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert (joined, thought or None) == texts(whole)
    message_id = next(item.id for item in events[-1].response.output if item.type == "message")
    of_message = [e.type for e in events if getattr(e, "item_id", None) == message_id
                  or getattr(getattr(e, "item", None), "id", None) == message_id]
    assert [n for n in of_message if not n.endswith(".delta")] == MESSAGE_EVENTS
    final = events[-1].response
    assert texts(final) == texts(whole) and final.usage.output_tokens == whole.usage.output_tokens
    assert [item.type for item in final.output] == [item.type for item in whole.output]


def test_the_clients_stream_helper_gets_the_final_response(api: openai.OpenAI, server: RunningServer) -> None:
    with api.responses.stream(model=server.model, input="hello there", **GREEDY) as stream:
        final = stream.get_final_response()
    assert texts(final) == texts(api.responses.create(model=server.model, input="hello there", **GREEDY))


def test_a_json_schema_format_is_the_chats_response_format(api: openai.OpenAI, server: RunningServer) -> None:
    """The same constraint as chat's json_schema response_format: the same greedy answer (a random model does not
    finish the object, so the two are compared as they are cut)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    response = api.responses.create(model=server.model, input="a number", temperature=0, max_output_tokens=12,
                                    text={"format": {"type": "json_schema", "name": "n", "schema": schema}})
    chat = api.chat.completions.create(model=server.model, temperature=0, max_tokens=12,
                                       messages=[{"role": "user", "content": "a number"}],
                                       response_format={"type": "json_schema", "json_schema": {"name": "n",
                                                                                              "schema": schema}})
    assert texts(response)[0] == (chat.choices[0].message.content or "")
    assert server.reasoning or texts(response)[0].startswith("{")
    assert response.text.format.type == "json_schema" and response.text.format.schema_ == schema


@pytest.mark.parametrize("extra,param", [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"tools": [WEATHER]}, "tool_choice"),  # "auto" needs --enable-auto-tool-choice, as in chat
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"), ({"background": True}, "background"),
    ({"include": ["reasoning.summary"]}, "include"), ({"include": "message.output_text.logprobs"}, "include"),
    ({"top_logprobs": 21}, "top_logprobs"), ({"include": [LOGPROBS], "top_logprobs": -1}, "top_logprobs"),
    ({"max_tool_calls": 0}, "max_tool_calls"), ({"previous_input_messages": [{}]}, "previous_input_messages"),
    ({"enable_response_messages": True}, "enable_response_messages"), ({"service_tier": "flex"}, "service_tier"),
    ({"vllm_xargs": {"a": 1}}, "vllm_xargs"), ({"kv_transfer_params": {}}, "kv_transfer_params"),
    ({"stop": False}, "stop"), ({"logit_bias": 5}, "logit_bias"), ({"request_id": ""}, "request_id"),
    ({"max_output_tokens": 0}, "max_output_tokens"), ({"max_output_tokens": 1000}, "max_output_tokens"),
    ({"input": []}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input"), ({"temperature": "hot"}, "temperature"),
    ({"model": "nope"}, "model")])
def test_what_a_response_cannot_honour_is_a_400_naming_it(server: RunningServer, extra: dict, param: str) -> None:
    response = httpx.post(server.base_url + "/v1/responses", json={"input": "hi", **extra}, timeout=30)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param


CHAT_EXTRAS = [{"stop": ["e", "a"], "include_stop_str_in_output": True}, {"stop_token_ids": [101, 102]},
               {"logit_bias": {"150": 100}, "ignore_eos": True}, {"chat_template_kwargs": {"custom_flag": True}}]


@PLAIN
@pytest.mark.parametrize("extras", CHAT_EXTRAS, ids=lambda e: next(iter(e)))
def test_vllms_chat_fields_give_the_chats_answer(server: RunningServer, extras: dict) -> None:
    body = {"temperature": 0, "seed": 1, "priority": 0, "prompt_cache_key": "k", "service_tier": "auto",
            "session_id": "s", **extras}
    response = httpx.post(server.base_url + "/v1/responses", json={"input": "hi", "max_output_tokens": 12, **body},
                          timeout=30)
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, **body}, timeout=30)
    assert response.status_code == 200 and chat.status_code == 200, (response.text, chat.text)
    text = response.json()["output"][-1]["content"][0]["text"]
    assert text == chat.json()["choices"][0]["message"]["content"]
    assert response.json()["usage"]["output_tokens"] == chat.json()["usage"]["completion_tokens"]
    assert response.json()["usage"]["input_tokens"] == chat.json()["usage"]["prompt_tokens"]


def test_chat_template_kwargs_are_checked_as_chats(server: RunningServer) -> None:
    kwargs = {"chat_template_kwargs": {"add_generation_prompt": False}}  # the chat refuses this one
    response = httpx.post(server.base_url + "/v1/responses", json={"input": "hi", **kwargs}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "chat_template_kwargs"


def calls(response) -> list[tuple[str, dict]]:
    return [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"]


@PLAIN
@pytest.mark.parametrize("choice,chat_choice,seed,limit", [
    ({"type": "function", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, 3, 120),
    ("required", "required", 4, 190)], ids=["named", "required"])
def test_a_forced_function_call_is_a_function_call_item(api: openai.OpenAI, server: RunningServer, choice,
                                                        chat_choice, seed, limit) -> None:
    """The chat's call for the same tools and choice, as a function_call item (no empty message beside it)."""
    sampled = {"temperature": 1.0, "seed": seed}  # a random model writes the call to its end here
    response = api.responses.create(model=server.model, input="weather in Oslo?", tools=[WEATHER],
                                    tool_choice=choice, max_output_tokens=limit, extra_body=sampled)
    chat = api.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "weather in Oslo?"}],
                                       tools=[CHAT_WEATHER], tool_choice=chat_choice, max_tokens=limit, **sampled)
    expected = [(c.function.name, json.loads(c.function.arguments)) for c in chat.choices[0].message.tool_calls]
    assert calls(response) == expected and expected[0][1]["city"] in CITIES
    assert [item.type for item in response.output] == ["function_call"] * len(expected)
    assert response.status == "completed" and response.tools[0].name == "get_weather"


@PLAIN
def test_a_streamed_call_sends_its_arguments_and_the_item_it_completes(api: openai.OpenAI,
                                                                      server: RunningServer) -> None:
    body = dict(model=server.model, input="weather?", tools=[WEATHER], max_output_tokens=120,
                tool_choice={"type": "function", "name": "get_weather"}, extra_body={"temperature": 1.0, "seed": 3})
    events = list(api.responses.create(stream=True, **body))
    names = [e.type for e in events]
    assert names[2] == "response.output_item.added" and events[2].item.type == "function_call"
    assert names[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    final = events[-1].response
    (item,) = final.output
    assert item.arguments == streamed == events[-3].arguments and item.call_id == events[2].item.call_id
    assert calls(final) == calls(api.responses.create(**body))


def test_function_calls_and_their_outputs_read_as_the_chats_messages(api: openai.OpenAI,
                                                                     server: RunningServer) -> None:
    """An earlier answer's call and what it returned go back in as the assistant's tool_calls and a tool message."""
    arguments = '{"city": "Oslo"}'
    items = [{"role": "user", "content": "weather in Oslo?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": arguments},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 18 C"}]
    response = api.responses.create(model=server.model, input=items, tools=[WEATHER], tool_choice="none", **GREEDY)
    chat = api.chat.completions.create(model=server.model, temperature=0, max_tokens=8, tools=[CHAT_WEATHER],
                                       tool_choice="none", messages=[
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 18 C"}])
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert texts(response)[0] == (chat.choices[0].message.content or "")


def test_an_abandoned_stream_leaves_nothing_behind(server: RunningServer) -> None:
    body = {"input": "hi", "max_output_tokens": 200, "stream": True}
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/responses", json=body) as response:
            assert response.status_code == 200
            next(response.iter_lines())
    stats = server.wait_idle(timeout=30)
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)


def test_reasoning_then_content_open_and_close_their_items_in_turn() -> None:
    view = _View(ResponsesRequest(input="x"), SimpleNamespace(id="resp-1", created=0,
                                                              engine=SimpleNamespace(model_name="m")),
                 SimpleNamespace(temperature=0.0, top_p=1.0), ChatText(reasoning_opened=True))
    events = _Events(view)
    sent = [e for part in ({"reasoning": "a"}, {"reasoning": "b"}, {"content": "c"}) for e in events.part(part, [])]
    sent += events.finish([])
    payloads = [json.loads(e.split("data: ", 1)[1]) for e in sent]
    assert [p["type"].removeprefix("response.") for p in payloads] == [
        "output_item.added", "content_part.added", "reasoning_text.delta", "reasoning_text.delta",
        "reasoning_text.done", "content_part.done", "output_item.done",
        "output_item.added", "content_part.added", "output_text.delta", "output_text.done", "content_part.done",
        "output_item.done"]
    assert [p["item"]["type"] for p in payloads if p["type"] == "response.output_item.done"] == ["reasoning", "message"]
    assert payloads[4]["text"] == "ab" and payloads[10]["text"] == "c"
    assert [p.get("output_index") for p in payloads] == [0] * 7 + [1] * 6


def test_a_stream_the_server_aborts_ends_with_openais_error_event() -> None:
    """An answer aborted under way (the server shutting down) ends its stream with an `error` event."""
    class Aborted:
        id, created, engine = "resp-2", 0, SimpleNamespace(model_name="m")

        async def outputs(self):
            raise RequestAborted("the server is shutting down")
            yield

        def abort_unfinished(self) -> None:
            pass

    view = _View(ResponsesRequest(input="x"), Aborted(), SimpleNamespace(temperature=0.0, top_p=1.0), ChatText())

    async def collect() -> list[str]:
        return [event async for event in view.stream()]

    events = [json.loads(e.split("data: ", 1)[1]) for e in asyncio.run(collect())]
    assert [e["type"] for e in events] == ["response.created", "response.in_progress", "error"]
    assert events[-1]["code"] == "request_aborted" and "shutting down" in events[-1]["message"]


def post(server: RunningServer, body: dict) -> dict:
    response = httpx.post(server.base_url + "/v1/responses", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def output_text(response: dict) -> dict:
    return next(item for item in response["output"] if item["type"] == "message")["content"][0]


def streamed(server: RunningServer, body: dict) -> list[dict]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
            lines = response.iter_lines()
            return [json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def without_bytes(entries: list[dict]) -> list[dict]:
    """Logprobs as the output_text events name them: no bytes."""
    return [{"token": e["token"], "logprob": e["logprob"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]}
            for e in entries]


def same_logprobs(a: list[dict], b: list[dict]) -> bool:
    """The same tokens and alternatives, their logprobs equal up to float noise (a cached prefix is attended in
    other pieces than a prompt computed whole)."""
    def names(entries: list[dict]) -> list:
        return [(e["token"], e.get("bytes"), [(t["token"], t.get("bytes")) for t in e["top_logprobs"]])
                for e in entries]

    def values(entries: list[dict]) -> list[float]:
        return [v for e in entries for v in [e["logprob"]] + [t["logprob"] for t in e["top_logprobs"]]]

    return names(a) == names(b) and values(a) == pytest.approx(values(b), abs=1e-4)


def test_included_logprobs_are_the_chats_for_the_same_answer(api: openai.OpenAI, server: RunningServer) -> None:
    """Every token's logprob and top alternatives, as chat's logprobs.content gives them (a reasoning model's
    reasoning tokens included there, as in vLLM's whole response)."""
    body = {"input": "hello there", "temperature": 0, "max_output_tokens": 8}
    response = post(server, {**body, "include": [LOGPROBS], "top_logprobs": 3})
    chat = httpx.post(server.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hello there"}], "temperature": 0, "max_tokens": 8,
        "logprobs": True, "top_logprobs": 3}).json()
    entries = output_text(response)["logprobs"]
    assert same_logprobs(entries, chat["choices"][0]["logprobs"]["content"]) and len(entries) == 8
    assert all(len(e["top_logprobs"]) == 3 and isinstance(e["bytes"], list) for e in entries)
    typed = api.responses.create(model=server.model, include=[LOGPROBS], top_logprobs=3, **body)
    message = next(item for item in typed.output if item.type == "message")
    typed_entries = [(lp.token, len(lp.top_logprobs)) for lp in message.content[0].logprobs]
    assert typed_entries == [(e["token"], 3) for e in entries]
    assert output_text(post(server, {**body, "include": [LOGPROBS]}))["logprobs"][0]["top_logprobs"] == []
    assert output_text(post(server, {**body, "top_logprobs": 3}))["logprobs"] is None  # not included: not given


@PLAIN
def test_a_stream_gives_each_deltas_logprobs_and_the_whole_in_the_end(server: RunningServer) -> None:
    body = {"input": "hello there", "temperature": 0, "max_output_tokens": 8, "include": [LOGPROBS],
            "top_logprobs": 2}
    whole = output_text(post(server, body))["logprobs"]
    events = streamed(server, body)
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert same_logprobs([entry for e in deltas for entry in e["logprobs"]], without_bytes(whole))
    assert "".join(e["token"] for e in whole) == "".join(e["delta"] for e in deltas)
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == [entry for e in deltas for entry in e["logprobs"]]
    (part_done,) = [e for e in events if e["type"] == "response.content_part.done"]
    assert part_done["part"]["logprobs"] == output_text(events[-1]["response"])["logprobs"]
    assert same_logprobs(part_done["part"]["logprobs"], whole)
    plain = streamed(server, {k: v for k, v in body.items() if k != "include"})
    assert all(e["logprobs"] == [] for e in plain if e["type"].startswith("response.output_text."))
    assert output_text(plain[-1]["response"])["logprobs"] is None


@pytest.mark.parametrize("server", ["deepseek_r1"], ids=["reasoning"], indirect=True)
def test_logprobs_of_a_hidden_reasoning_are_not_given(server: RunningServer) -> None:
    """include_reasoning false leaves the reasoning out: its tokens' logprobs would show it, so none are given (null,
    as vLLM), whole or streamed; this model's answer is all reasoning, whose deltas carry none anyway."""
    body = {"input": "hello there", "temperature": 0, "max_output_tokens": 8, "include": [LOGPROBS]}
    assert output_text(post(server, {**body, "include_reasoning": False}))["logprobs"] is None
    events = streamed(server, {**body, "include_reasoning": False})
    assert output_text(events[-1]["response"])["logprobs"] is None
    assert all(e["logprobs"] == [] for e in events if e["type"].startswith("response.output_text."))
    shown = streamed(server, body)
    assert not [e for e in shown if e["type"] == "response.output_text.delta"]
    assert output_text(shown[-1]["response"])["logprobs"] == []


def test_an_answers_items_sent_back_read_as_one_assistant_message() -> None:
    """vLLM's join: reasoning, text and calls of one answer fill in one assistant message; encrypted reasoning is
    refused."""
    from pagedllm.entrypoints.responses_protocol import chat_messages

    items = ResponsesRequest(input=[
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "checking"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}]},
        {"role": "user", "content": "thanks"}]).input
    assert chat_messages(items) == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "checking"}], "reasoning": "hmm",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": None, "reasoning": "short"},
        {"role": "user", "content": "thanks"}]
    secret = ResponsesRequest(input=[{"type": "reasoning", "summary": [], "encrypted_content": "x"}])
    with pytest.raises(InvalidInputError, match="encrypted_content"):
        chat_messages(secret.input)


def test_a_clients_loop_sends_an_answers_output_back_as_input(server: RunningServer) -> None:
    """input += response.output, as OpenAI's clients continue a conversation: the answer's items (a reasoning item
    too, with a reasoning parser) are taken, and read as the chat's assistant message with that reasoning."""
    first = post(server, {"input": "hello there", **GREEDY})
    turns = [{"role": "user", "content": "hello there"}, *first["output"], {"role": "user", "content": "and then?"}]
    second = post(server, {"input": turns, **GREEDY})
    reasoning = next((item["content"][0]["text"] for item in first["output"] if item["type"] == "reasoning"), None)
    assistant = {"role": "assistant", "content": output_text(first)["text"],
                 **({"reasoning": reasoning} if reasoning is not None else {})}
    chat = httpx.post(server.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [turns[0], assistant, turns[-1]], "temperature": 0, "max_tokens": 8}).json()
    assert second["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]
    assert output_text(second)["text"] == (chat["choices"][0]["message"]["content"] or "")


def test_the_includes_vllm_takes_add_nothing_else(server: RunningServer) -> None:
    """Encrypted reasoning, other tools' outputs, input images: never made here, so asking adds nothing (vLLM's)."""
    body = {"input": "hello there", **GREEDY}
    asked = post(server, {**body, "include": ["reasoning.encrypted_content", "file_search_call.results"],
                          "max_tool_calls": 2})  # OpenAI's bound on built-in tools' calls: none here, given back
    assert asked["max_tool_calls"] == 2
    plain = post(server, body)
    assert [item["type"] for item in asked["output"]] == [item["type"] for item in plain["output"]]
    assert output_text(asked)["text"] == output_text(plain)["text"] and output_text(asked)["logprobs"] is None
    assert all(item.get("encrypted_content") is None for item in asked["output"] if item["type"] == "reasoning")
