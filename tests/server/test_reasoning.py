"""Reasoning parsers (pagedllm/entrypoints/reasoning.py): a thinking model's answer split into reasoning and
content, and a stream sending exactly what the whole answer holds however its text comes."""

from __future__ import annotations

import random

import pytest

from pagedllm.entrypoints.reasoning import (ReasoningStream, count_reasoning_tokens, opens_in_reasoning,
                                            split_reasoning, think_token_ids)


@pytest.mark.parametrize("text,opened,expected", [
    ("<think>\nweigh it\n</think>\n\nYes.", False, ("\nweigh it\n", "\n\nYes.")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("plain answer", False, (None, "plain answer")),
    ("plain </think> answer", False, (None, "plain </think> answer")),  # not open: all content
    ("weigh it</think>Yes.", True, ("weigh it", "Yes.")),  # the prompt opened the block
    ("<think>cut short", False, ("cut short", None)),
    ("still thinking", True, ("still thinking", None)),
    ("<think>a</think>", True, ("a", None)),
    ("<thi", False, (None, "<thi")),
    ("", True, (None, None)),
])  # fmt: skip
def test_an_answer_splits_into_reasoning_and_content(text, opened, expected):
    assert split_reasoning(text, opened) == expected


def test_which_answers_begin_in_reasoning():
    assert opens_in_reasoning("deepseek_r1", "<|Assistant|>")
    assert opens_in_reasoning("qwen3", "<|im_start|>assistant\n<think>\n")
    assert not opens_in_reasoning("qwen3", "<|im_start|>assistant\n")
    assert not opens_in_reasoning("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n")  # thinking off
    with pytest.raises(ValueError):
        opens_in_reasoning("granite", "")


@pytest.mark.parametrize("text", ["<think>\nweigh it\n</think>\n\nYes.", " <thin", "<think>a</thi",
                                  "a</think>b</think>", "no reasoning at all", "<think></think>"])  # fmt: skip
@pytest.mark.parametrize("opened", [False, True])
def test_a_stream_sends_what_the_whole_answer_holds(text, opened):
    rng = random.Random(3)
    whole = split_reasoning(text, opened)
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 8))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        stream, reasoning, content = ReasoningStream(opened), "", ""
        for i, piece in enumerate(pieces):
            r, c = stream.feed(piece, i == len(pieces) - 1)
            reasoning, content = reasoning + r, content + c
        assert (reasoning or None, content or None) == whole


def test_a_stream_holds_only_what_may_yet_be_a_tag():
    stream = ReasoningStream(False)
    assert stream.feed("<th", False) == ("", "")
    assert stream.feed("ink>Let me see</th", False) == ("Let me see", "")
    assert stream.feed("ink>\n\nYes", False) == ("", "\n\nYes")
    plain = ReasoningStream(False)
    assert plain.feed("Hello", False) == ("", "Hello")


def test_tool_calls_are_looked_for_after_the_reasoning_whole_or_streamed():
    from pagedllm.entrypoints.server.chat_text import ChatText, ChoiceStream
    from pagedllm.entrypoints.tool_calls import resolve_tool_choice

    tools = resolve_tool_choice([{"type": "function", "function": {"name": "f"}}], "auto", None, "hermes", True)
    chat = ChatText(tools, reasoning_opened=False)
    text = '<think>call f? <tool_call> is how</think>\n<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    whole = chat.message(text, "stop")
    assert whole["finish_reason"] == "tool_calls" and whole["message"]["reasoning"] == "call f? <tool_call> is how"
    assert whole["message"]["content"] == "\n"
    assert whole["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    stream, deltas = ChoiceStream(chat), []
    for i in range(0, len(text), 5):
        deltas += stream.feed(text[i:i + 5], i + 5 >= len(text))
    assert "".join(d.get("reasoning", "") for d in deltas) == whole["message"]["reasoning"]
    assert "".join(d.get("content", "") for d in deltas) == whole["message"]["content"]
    assert [c["function"] for d in deltas for c in d.get("tool_calls", [])] == [{"name": "f", "arguments": '{"a": 1}'}]
    assert stream.finish_reason("stop") == "tool_calls"
    hidden = ChatText(tools, reasoning_opened=False, include_reasoning=False).message(text, "stop")["message"]
    assert hidden["reasoning"] is None and hidden["tool_calls"]


@pytest.mark.parametrize("ids,opened,expected", [
    ([7, 1, 2, 8, 3], False, 2),  # <think> 1 2 </think> 3
    ([1, 2, 8, 3], True, 2),  # the prompt opened it
    ([1, 2, 3], True, 3),  # cut short: all of it
    ([7, 1, 2], False, 2),
    ([1, 7, 2, 8], False, 0),  # not open at the start: no reasoning
    ([], True, 0),
])  # fmt: skip
def test_reasoning_tokens_are_counted_by_the_tags_ids(ids, opened, expected):
    assert count_reasoning_tokens(ids, (7, 8), opened) == expected


def test_the_tags_count_only_where_each_is_one_token():
    assert think_token_ids({"<think>": 7, "</think>": 8, "a": 1}) == (7, 8)
    assert think_token_ids({"<think>": 7}) is None
