"""Tool calling's own logic (pagedllm/entrypoints/tool_calls): which choices a request may make, the schema a forced
call is held to, the hermes parser, and a streamed choice sending exactly what the whole answer holds."""

from __future__ import annotations

import json
import random

import pytest

from pagedllm.entrypoints.server.chat_parsers import ChatParsers
from pagedllm.entrypoints.tool_calls import ToolCallStream, parse_message, resolve_tool_choice
from pagedllm.entrypoints.tool_calls.parsers import HermesParser, Llama3JsonParser, MistralParser, PythonicParser
from pagedllm.errors import InvalidInputError

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "the local time"}}
TOOLS = [WEATHER, CLOCK]


def choice(tool_choice=None, parallel=None, tools=TOOLS):
    return resolve_tool_choice(tools, tool_choice, parallel, "hermes", True)


@pytest.mark.parametrize("tools,tool_choice,auto,message", [
    (None, "required", True, "tool_choice needs tools"),
    ([], "auto", True, "non-empty list"),
    ([{"type": "function"}], "none", True, r"tools\[0\] must be"),
    ([{"type": "code_interpreter", "function": {"name": "x"}}], "none", True, "only function tools"),
    ([{"type": "function", "function": {"name": ""}}], "none", True, "name must be a non-empty"),
    ([WEATHER, WEATHER], "none", True, "twice"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], "none", True, "parameters must be"),
    (TOOLS, "always", True, 'must be "none", "auto"'),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, True, "not among the tools"),
    (TOOLS, {"type": "function"}, True, "must name a function"),
    (TOOLS, {"type": "function", "function": {"name": 3}}, True, "non-empty string"),
    (TOOLS, None, False, "--enable-auto-tool-choice"),
    (TOOLS, "auto", False, "--enable-auto-tool-choice"),
])  # fmt: skip
def test_bad_tools_and_choices_are_refused_naming_the_field(tools, tool_choice, auto, message):
    with pytest.raises(InvalidInputError, match=message):
        resolve_tool_choice(tools, tool_choice, None, "hermes" if auto else None, auto)


def test_the_choices_and_what_they_hold_the_answer_to():
    assert resolve_tool_choice(None, None, None, None, False) is None
    assert resolve_tool_choice(None, "none", None, None, False) is None
    assert choice("none").constraint() is None and choice().mode == "auto" and choice().constraint() is None
    named = choice({"type": "function", "function": {"name": "get_weather"}})
    assert named.constraint().json == WEATHER["function"]["parameters"]
    no_parameters = choice({"type": "function", "function": {"name": "get_time"}})
    assert no_parameters.constraint().json == {"type": "object", "properties": {}}
    required = choice("required").constraint().json
    assert required["type"] == "array" and required["minItems"] == 1 and "maxItems" not in required
    names = [option["properties"]["name"]["enum"] for option in required["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert choice("required", parallel=False).constraint().json["maxItems"] == 1


def test_required_joins_the_functions_defs_at_the_top_and_leaves_the_request_as_it_was():
    def with_defs(name, defs):
        return {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": defs}}}

    tools = [with_defs("a", {"P": {"type": "string"}}), with_defs("b", {"P": {"type": "string"}})]
    schema = choice("required", tools=tools).constraint().json
    assert schema["$defs"] == {"P": {"type": "string"}} and "$defs" in tools[0]["function"]["parameters"]
    clash = [with_defs("a", {"P": {"type": "string"}}), with_defs("b", {"P": {"type": "integer"}})]
    with pytest.raises(InvalidInputError, match="twice"):
        choice("required", tools=clash).constraint()


def test_the_server_settings_are_checked():
    with pytest.raises(InvalidInputError, match="needs --tool-call-parser"):
        ChatParsers(None, True)
    with pytest.raises(InvalidInputError, match="not known"):
        ChatParsers("granite", True)
    assert ChatParsers("llama3_json", True).tool_call_parser == "llama3_json"


def parsed(parser, text):
    """What a parser finds: (content, [(name, arguments)]), or None."""
    found = parser().parse(text)
    return None if found is None else (found[0], [(c.name, c.arguments) for c in found[1]])


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'


@pytest.mark.parametrize("text,expected", [
    ("plain words", None),
    (CALL, (None, [("get_weather", {"city": "Zürich"})])),
    ("Checking. " + CALL + CALL.replace("weather", "time"),
     ("Checking. ", [("get_weather", {"city": "Zürich"}), ("get_time", {"city": "Zürich"})])),
    ('<tool_call>{"name": "get_time", "arguments": {}}', (None, [("get_time", {})])),  # cut at the end: read so
    ('<tool_call>{"name": "get_time", "arguments": {', None),  # a call that does not parse: all is content
    ('<tool_call>{"name": "get_time"}</tool_call>', None),  # no arguments
    ('<tool_call>["get_time"]</tool_call>', None),
])  # fmt: skip
def test_hermes_finds_the_calls_or_leaves_all_as_content(text, expected):
    assert parsed(HermesParser, text) == expected


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Zürich"}}'


@pytest.mark.parametrize("text,expected", [
    ("plain words", None),
    (LLAMA_CALL, (None, [("get_weather", {"city": "Zürich"})])),
    ("<|python_tag|>" + LLAMA_CALL + "; " + LLAMA_CALL.replace("parameters", "arguments"),
     (None, [("get_weather", {"city": "Zürich"})] * 2)),
    ("Sure. " + LLAMA_CALL, ("Sure. ", [("get_weather", {"city": "Zürich"})])),
    ('{"name": "f", "arguments": {"x": 1}, "parameters": {"y": 2}}', (None, [("f", {"x": 1})])),
    ("a set {1, 2}", None),  # a brace that begins no call: all is content
    ('{"city": "Oslo"}', None),  # no name
    (LLAMA_CALL + ' {"name": "get_time"}', None),
    ('{"name": "get_weather", "parameters": {"ci', None),  # cut short
])  # fmt: skip
def test_llama3_json_finds_the_calls_or_leaves_all_as_content(text, expected):
    assert parsed(Llama3JsonParser, text) == expected


@pytest.mark.parametrize("text,expected", [
    ('[get_weather(city="Zürich", days=-2, o={"a": true, "b": [1, (2, 3)], "c": null}), get_time()]',
     (None, [("get_weather", {"city": "Zürich", "days": -2, "o": {"a": True, "b": [1, [2, 3]], "c": None}}),
             ("get_time", {})])),
    ("plain words", None),
    (" [f()]", None),  # a call list begins the answer
    ("[f(1)]", None),  # positional arguments
    ("[f(**kw)]", None),
    ("[f(a=x)]", None),  # a name that is not a literal
    ('[f(a=b"x")]', None),  # bytes are no JSON value
    ("[f(a=1)] and more", None),
    ("[f(a=", None),  # cut short
    ("[]", None),
    ("[x]", None),
    ("[" * 2000 + "]" * 2000, None),
])  # fmt: skip
def test_pythonic_finds_the_calls_or_leaves_all_as_content(text, expected):
    assert parsed(PythonicParser, text) == expected


@pytest.mark.parametrize("text,expected", [
    ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Zürich"}}, {"name": "get_time", "arguments": {}}]',
     (None, [("get_weather", {"city": "Zürich"}), ("get_time", {})])),  # before v11: a JSON list
    ('Sure.[TOOL_CALLS] {"name": "get_time", "arguments": "{\\"tz\\": 1}"}',
     ("Sure.", [("get_time", {"tz": 1})])),  # one object; arguments given as JSON text
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time{}',
     (None, [("get_weather", {"city": "Oslo"}), ("get_time", {})])),  # v11 and later
    ("no calls", None),
    ("[TOOL_CALLS]get_time", None),  # no arguments
    ('[TOOL_CALLS][{"name": "f"}]', None),
    ('[TOOL_CALLS][ARGS]{"a": 1}', None),  # no name
    ('[TOOL_CALLS]f[ARGS]{"a": ', None),  # cut short
])  # fmt: skip
def test_mistral_finds_the_calls_or_leaves_all_as_content(text, expected):
    assert parsed(MistralParser, text) == expected


def test_call_ids_take_the_form_the_parsers_models_need():
    mistral = resolve_tool_choice(TOOLS, {"type": "function", "function": {"name": "get_time"}}, None, "mistral", True)
    [call] = parse_message(mistral, "{}").tool_calls
    assert len(call.id) == 9 and call.id.isalnum()  # Mistral's templates refuse any other id sent back
    [call] = parse_message(choice({"type": "function", "function": {"name": "get_time"}}), "{}").tool_calls
    assert call.id.startswith("chatcmpl-tool-")


def test_an_auto_answer_as_a_message():
    parsed = parse_message(choice(), "Checking. " + CALL + CALL)
    assert parsed.content == "Checking. " and len(parsed.tool_calls) == 2
    assert json.loads(parsed.tool_calls[0].arguments) == {"city": "Zürich"}
    assert "Zürich" in parsed.tool_calls[0].arguments  # not escaped, as vLLM writes it
    assert parsed.tool_calls[0].id != parsed.tool_calls[1].id and parsed.tool_calls[0].id.startswith("chatcmpl-tool-")
    assert parsed.finish_reason(choice(), "length") == "tool_calls"
    assert len(parse_message(choice(parallel=False), CALL + CALL).tool_calls) == 1  # parallel_tool_calls false
    broken = parse_message(choice(), "Hi <tool_call>{")
    assert (broken.content, broken.tool_calls, broken.finish_reason(choice(), "length")) == ("Hi <tool_call>{", [],
                                                                                          "length")


def test_forced_answers_as_messages():
    named = choice({"type": "function", "function": {"name": "get_weather"}})
    parsed = parse_message(named, '{"city": "Oslo"}')
    assert parsed.content == "" and [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_weather",
                                                                                              '{"city": "Oslo"}')]
    assert parsed.finish_reason(named, "stop") == "stop"  # OpenAI's for a named call
    assert parse_message(named, "  ").tool_calls == []
    required = choice("required")
    parsed = parse_message(required, '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, '
                                     '{"name": "get_time", "parameters": {}}]')
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("get_weather", {"city": "Oslo"}),
                                                                              ("get_time", {})]
    assert parsed.finish_reason(required, "stop") == "tool_calls"
    cut = parse_message(required, '[{"name": "get_weather", "param')
    assert cut.tool_calls == [] and cut.finish_reason(required, "length") == "length"


def _streamed(tool_choice, text, rng):
    """Feed `text` in random pieces; what the chunks add up to, as a client joins them."""
    stream, content, calls = ToolCallStream(tool_choice), "", {}
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) if len(text) > 1 else []
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    for i, piece in enumerate(pieces):
        new_content, entries = stream.feed(piece, i == len(pieces) - 1)
        content += new_content
        for entry in entries:
            call = calls.setdefault(entry["index"], {"name": "", "arguments": ""})
            call["name"] += entry["function"].get("name", "")
            call["arguments"] += entry["function"].get("arguments", "")
            assert ("id" in entry) == (entry["function"].get("name") is not None)  # a call's first entry names it
    return content or None, [(c["name"], c["arguments"]) for _, c in sorted(calls.items())], stream


@pytest.mark.parametrize("tool_choice,text", [
    ("auto", "Checking. " + CALL + " trailing words " + CALL),
    ("auto", "no calls here, only < and <tool and <tool_cal"),
    ("auto", "Hi <tool_call>{"),  # a call that never parses: all of it was content
    ("auto", CALL),
    ("llama3_json", "Sure. <|python_tag|>" + LLAMA_CALL + "; " + LLAMA_CALL),
    ("llama3_json", "no call, only <|python and a set {1, 2}"),
    ("llama3_json", "<|python_t"),
    ("pythonic", '[get_weather(city="Oslo"), get_time()]'),
    ("pythonic", "[get_weather(city="),
    ("pythonic", "words [f()]"),
    ("mistral", 'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time{}'),
    ("mistral", "[TOOL_CA but not a call"),
    ("required", '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "A"}}]'),
    ("required", '[{"name": "get_time", "param'),
    ({"type": "function", "function": {"name": "get_weather"}}, '\n {"city": "Oslo"}'),
    ({"type": "function", "function": {"name": "get_weather"}}, " "),
])  # fmt: skip
def test_a_stream_sends_what_the_whole_answer_holds_however_the_text_comes(tool_choice, text):
    rng = random.Random(7)
    parser = tool_choice if tool_choice in ("llama3_json", "pythonic", "mistral") else None
    resolved = resolve_tool_choice(TOOLS, "auto", None, parser, True) if parser else choice(tool_choice)
    whole = parse_message(resolved, text)
    expected_content = whole.content or None
    for _ in range(40):
        content, calls, stream = _streamed(resolved, text, rng)
        assert content == expected_content
        assert calls == [(c.name, c.arguments) for c in whole.tool_calls]
        assert stream.finish_reason("stop") == whole.finish_reason(resolved, "stop")


def test_a_stream_sends_content_before_a_call_as_it_comes_and_holds_a_possible_tag():
    stream = ToolCallStream(choice())
    assert stream.feed("Let me <tool", False) == ("Let me ", [])
    assert stream.feed("_call>{", False) == ("", [])
    assert stream.feed("x", False) == ("", [])
    named = ToolCallStream(choice({"type": "function", "function": {"name": "get_time"}}))
    assert named.feed("\n", False) == ("", [])  # a call begins at its first visible character
    [entry] = named.feed('{"', False)[1]
    assert entry["function"] == {"name": "get_time", "arguments": '\n{"'} and entry["type"] == "function"
    assert named.feed("}", True)[1] == [{"index": 0, "function": {"arguments": "}"}}]
