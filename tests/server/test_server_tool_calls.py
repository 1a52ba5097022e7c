"""Tool calling through the server, with the openai client, on a tiny random model served with a chat template
that lists the tools (`--chat-template`): the tools reach the template, a named or required choice is held to its
schema, "auto" finds the model's calls with the hermes parser, and a stream carries the same calls, content and
logprobs as the whole answer."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from server_harness import start_server

TEMPLATE = ("{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n"
            "{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
            "{% for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments.city }}){% endfor %}"
            "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CITIES = ["Oslo", "Paris", "Rome"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                          "required": ["city"], "additionalProperties": False}}}  # fmt: skip
CLOCK = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, CLOCK]
MESSAGES = [{"role": "user", "content": "weather in Oslo?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# "auto" on a random model: a regex makes it write text, then a call in the hermes format
CALL_REGEX = (r'Checking\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "(Oslo|Rome)"\}\}</tool_call>')


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from conftest import real_config

    from pagedllm.engine.llm_engine import LLMEngine

    return LLMEngine(real_config(tiny_llama_dir))


@pytest.fixture(scope="module")
def servers(engine):
    """The same engine served twice in turn is not possible; one server with auto tool choice on is enough,
    and ChatParsers() (off) is checked on its own below."""
    server = start_server(engine, chat_parsers=ChatParsers("hermes", True), chat_template=TEMPLATE)  # --chat-template
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api(servers):
    client = openai.OpenAI(base_url=servers.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    client.served_model = servers.model
    return client


def ask(api, stream=False, **body):
    body = {"messages": MESSAGES, "temperature": 0, "max_tokens": 120, **body}
    return api.chat.completions.create(model=api.served_model, stream=stream, **body)


def joined(chunks) -> dict[int, dict]:
    """Per choice, what a client joins from the stream: content, calls, finish reason, logprob entries."""
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk.choices:
            got = choices.setdefault(c.index, {"content": "", "calls": {}, "finish": None, "logprobs": 0})
            got["content"] += c.delta.content or ""
            for entry in c.delta.tool_calls or []:
                call = got["calls"].setdefault(entry.index, {"id": entry.id, "name": "", "arguments": ""})
                call["name"] += entry.function.name or ""
                call["arguments"] += entry.function.arguments or ""
            got["finish"] = c.finish_reason or got["finish"]
            got["logprobs"] += len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0
    return choices


def as_joined(choice) -> dict:
    calls = {i: {"name": c.function.name, "arguments": c.function.arguments}
             for i, c in enumerate(choice.message.tool_calls or [])}
    return {"content": choice.message.content or "", "calls": calls, "finish": choice.finish_reason}


def same_as_whole(streamed: dict, whole) -> bool:
    calls = {i: {"name": c["name"], "arguments": c["arguments"]} for i, c in streamed["calls"].items()}
    return {"content": streamed["content"], "calls": calls, "finish": streamed["finish"]} == as_joined(whole)


def test_the_tools_reach_the_chat_template(servers):
    with httpx.Client(base_url=servers.base_url, timeout=30) as http:
        with_tools = http.post("/tokenize", json={"messages": MESSAGES, "tools": TOOLS}).json()
        without = http.post("/tokenize", json={"messages": MESSAGES}).json()
        text = http.post("/detokenize", json={"tokens": with_tools["tokens"]}).json()["prompt"]
    assert "get_weather;get_time;" in text and with_tools["count"] > without["count"]


def test_a_named_function_is_called_with_arguments_its_schema_accepts(api):
    response = ask(api, tools=TOOLS, tool_choice=NAMED, n=2, temperature=1.0, seed=3)
    for choice in response.choices:
        [call] = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("chatcmpl-tool-")
        assert choice.finish_reason == "stop" and choice.message.content == ""
        assert json.loads(call.function.arguments)["city"] in CITIES


def test_required_calls_one_or_more_of_the_functions(api):
    for parallel in (None, False):
        extra = {} if parallel is None else {"parallel_tool_calls": parallel}
        choice = ask(api, tools=TOOLS, tool_choice="required", temperature=1.0, seed=4, max_tokens=190,
                     **extra).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        assert parallel is None or len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            arguments = json.loads(call.function.arguments)
            assert call.function.name in ("get_weather", "get_time") and isinstance(arguments, dict)
            assert call.function.name != "get_weather" or arguments["city"] in CITIES


def test_auto_finds_the_calls_in_the_models_text(api):
    choice = ask(api, tools=TOOLS, extra_body={"structured_outputs": {"regex": CALL_REGEX}}).choices[0]
    [call] = choice.message.tool_calls
    assert choice.message.content == "Checking. " and choice.finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] in ("Oslo", "Rome")
    plain = ask(api, tools=TOOLS, max_tokens=8).choices[0]  # no call: the text is the content
    assert plain.message.tool_calls is None and plain.message.content and plain.finish_reason == "length"
    none = ask(api, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0]
    assert none.message.tool_calls is None and none.message.content == plain.message.content


@pytest.mark.parametrize("body", [
    dict(tools=TOOLS, tool_choice=NAMED),
    dict(tools=TOOLS, tool_choice="required", max_tokens=190),
    dict(tools=TOOLS, extra_body={"structured_outputs": {"regex": CALL_REGEX}}),
    dict(tools=TOOLS, tool_choice=NAMED, max_tokens=5),  # cut short: the arguments so far
], ids=["named", "required", "auto", "named-cut"])  # fmt: skip
def test_a_stream_carries_what_the_whole_answer_holds(api, body):
    whole = ask(api, logprobs=True, **body)
    [streamed] = joined(ask(api, stream=True, logprobs=True, **body)).values()
    assert same_as_whole(streamed, whole.choices[0])
    assert streamed["logprobs"] == whole.usage.completion_tokens  # none lost while a call was held
    assert all(call["id"] for call in streamed["calls"].values())


def test_a_conversation_with_a_call_and_its_result_goes_on(servers, api):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]  # fmt: skip
    with httpx.Client(base_url=servers.base_url, timeout=30) as http:
        ids = http.post("/tokenize", json={"messages": history, "tools": TOOLS}).json()["tokens"]
        text = http.post("/detokenize", json={"tokens": ids}).json()["prompt"]
    assert "get_weather(Oslo)" in text  # the template read the arguments as an object
    assert ask(api, messages=history, tools=TOOLS, tool_choice="none", max_tokens=4).choices[0].message.content


@pytest.mark.parametrize("body,param,message", [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "not among the tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": []}, "tools", "non-empty"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools", "name"),
    ({"tools": TOOLS, "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "structured_outputs",
     "cannot both be given"),
    ({"functions": [{"name": "f"}]}, "functions", "use tools"),
])  # fmt: skip
def test_bad_tool_requests_are_400s_naming_the_field(servers, body, param, message):
    with httpx.Client(base_url=servers.base_url, timeout=30) as http:
        response = http.post("/v1/chat/completions", json={"messages": MESSAGES, **body})
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert message in response.json()["error"]["message"]


def test_auto_needs_the_server_to_allow_it(engine):
    server = start_server(engine)  # no --enable-auto-tool-choice
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            refused = http.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS})
            named = http.post("/v1/chat/completions", json={"messages": MESSAGES, "tools": TOOLS,
                                                            "tool_choice": NAMED, "max_tokens": 60})
    finally:
        server.stop()
    assert refused.status_code == 400 and "--enable-auto-tool-choice" in refused.json()["error"]["message"]
    assert named.status_code == 200 and named.json()["choices"][0]["message"]["tool_calls"]


def test_abandoned_tool_call_streams_leave_nothing_behind(servers):
    """Clients that hang up while a call is held (auto, required) or streamed (named)."""
    bodies = [{"tools": TOOLS, "tool_choice": NAMED}, {"tools": TOOLS, "tool_choice": "required"},
              {"tools": TOOLS, "structured_outputs": {"regex": CALL_REGEX}}]
    with httpx.Client(base_url=servers.base_url, timeout=30) as http:
        for body in bodies:
            request = {"messages": MESSAGES, "max_tokens": 120, "stream": True, "n": 2, **body}
            with http.stream("POST", "/v1/chat/completions", json=request) as response:
                for i, _ in enumerate(response.iter_lines()):
                    if i == 3:
                        break
    stats = servers.wait_idle()
    assert (stats.num_running, stats.num_waiting, stats.blocks_used) == (0, 0, 0)
