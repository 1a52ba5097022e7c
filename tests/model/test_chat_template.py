"""Conversations through the chat template: messages normalised as the server takes them, the template's own
errors as clear InvalidInputErrors, and the vLLM options (no generation prompt, continuing the last message)."""

import pytest
from tiny import make_tiny_tokenizer

from pagedllm.errors import InvalidInputError
from pagedllm.model.chat_template import render_chat, template_messages


CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 40, "b": 2}'}}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tiny_tokenizer()


def test_messages_are_normalised_as_the_server_takes_them():
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}],
         "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    assert template_messages(messages) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "line one\nline two", "name": "alice"},  # joined by newlines, as vLLM does
        {"role": "assistant", "content": "", "tool_calls": [  # arguments as the templates read them
            {**CALL, "function": {"name": "add", "arguments": {"a": 40, "b": 2}}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]


@pytest.mark.parametrize("arguments,expected", [
    ('{"a": 1}', {"a": 1}), ({"a": 1}, {"a": 1}), ("", {}), (None, {}), ("not json", {}), ("[1, 2]", {}),
])  # fmt: skip
def test_tool_call_arguments_reach_the_template_as_an_object(arguments, expected):
    """OpenAI's clients send them as JSON text; one that is not a JSON object becomes {} (as vLLM makes it), so
    that a conversation holding it can go on."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    [message] = template_messages([{"role": "assistant", "content": None, "tool_calls": [call]}])
    assert message["tool_calls"][0]["function"]["arguments"] == expected
    assert "tool_calls" not in template_messages([{"role": "assistant", "content": "x", "tool_calls": []}])[0]


def test_tools_reach_the_template(tokenizer):
    template = ("{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "add"}}]
    text = render_chat(tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=False,
                       chat_template=template, tools=tools)
    assert text == "[add]hi"


@pytest.mark.parametrize("messages,message", [
    ([{"role": "user", "content": [{"type": "image_url"}]}], "type 'image_url' are not supported"),
    ([{"role": "user", "content": [{"type": "text"}]}], "needs its 'text' string"),
    ([{"content": "x"}], "needs a string 'role'"),
    ([["user", "x"]], "list of"),
    ([{"role": "assistant", "tool_calls": [{"id": "c1"}]}], "each of tool_calls must be"),
    ([{"role": "assistant", "tool_calls": {"id": "c1"}}], "tool_calls must be a list"),
])  # fmt: skip
def test_bad_messages_are_refused(tokenizer, messages, message):
    with pytest.raises(InvalidInputError, match=message):
        render_chat(tokenizer, messages)


def test_the_generation_prompt_and_continuing_the_last_message_follow_transformers(tokenizer):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, I"}]
    for options in ({"add_generation_prompt": False}, {"add_generation_prompt": False, "continue_final_message": True}):
        assert render_chat(tokenizer, messages, **options) == tokenizer.apply_chat_template(
            messages, tokenize=False, **options)
    assert render_chat(tokenizer, messages, add_generation_prompt=False, continue_final_message=True).endswith(
        "Hello, I")
    with pytest.raises(InvalidInputError, match="continue_final_message cannot be combined"):
        render_chat(tokenizer, messages, continue_final_message=True)


@pytest.mark.parametrize("template,message", [
    (None, "this model has no chat template"),
    ("{% for m in messages %}{{ m.content }", "does not compile"),
    ("{{ raise_exception('roles must alternate') }}", "refused these messages: roles must alternate"),
    ("{{ messages[0].content + 1 }}", "could not render these messages: TypeError"),
])  # fmt: skip
def test_the_templates_own_problems_are_named(template, message):
    broken = make_tiny_tokenizer()
    broken.chat_template = template
    with pytest.raises(InvalidInputError, match=message):
        render_chat(broken, [{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("kwargs", [{"add_generation_prompt": False}, {"tokenize": True}, {"continue_final_message": 1}])
def test_template_kwargs_may_not_set_the_calls_own_parameters(tokenizer, kwargs):
    with pytest.raises(InvalidInputError, match=f"chat_template_kwargs may not set {next(iter(kwargs))}"):
        render_chat(tokenizer, [{"role": "user", "content": "hi"}], template_kwargs=kwargs)


def test_template_kwargs_and_message_fields_reach_the_template():
    custom = make_tiny_tokenizer()
    custom.chat_template = "{% for m in messages %}{{ m.role }}/{{ m.name }}:{{ m.content }};{% endfor %}{{ flavour }}"
    text = render_chat(custom, [{"role": "user", "content": "x", "name": "alice"}], template_kwargs={"flavour": "salt"})
    assert text == "user/alice:x;salt"


def test_an_assistants_reasoning_reaches_the_template_under_both_names():
    """vLLM's `reasoning` (or the older `reasoning_content`) of an assistant message, for templates that show
    earlier thinking; another role's is dropped."""
    custom = make_tiny_tokenizer()
    custom.chat_template = ("{% for m in messages %}{{ m.role }}:{{ m.reasoning_content }}/{{ m.reasoning }}/"
                            "{{ m.content }};{% endfor %}")
    messages = [{"role": "user", "content": "q", "reasoning": "not mine"},
                {"role": "assistant", "content": "a", "reasoning": "think"},
                {"role": "assistant", "content": "b", "reasoning_content": "older"},
                {"role": "assistant", "content": "c"}]
    assert render_chat(custom, messages, add_generation_prompt=False) == (
        "user://q;assistant:think/think/a;assistant:older/older/b;assistant://c;")
    with pytest.raises(InvalidInputError, match="reasoning must be text"):
        template_messages([{"role": "assistant", "content": "a", "reasoning": 3}])


def test_documents_reach_a_template_that_takes_them(tokenizer):
    import copy

    rag = copy.deepcopy(tokenizer)
    rag.chat_template = ("{% for d in documents or [] %}[{{ d['title'] }}]{% endfor %}{{ reasoning_effort }}"
                         "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    messages = [{"role": "user", "content": "q"}]
    assert render_chat(rag, messages, documents=[{"title": "a"}, {"title": "b"}],
                       template_kwargs={"reasoning_effort": "low"}) == "[a][b]lowq"
    assert render_chat(rag, messages) == "q"


def test_a_template_of_ones_own_serves_a_model_that_has_none():
    """As vLLM's --chat-template: a template sent with the request stands in for the model's missing one."""
    bare = make_tiny_tokenizer()
    bare.chat_template = None
    text = render_chat(bare, [{"role": "user", "content": "hi"}], chat_template="{{ messages[0].content }}!")
    assert text == "hi!"


def test_a_command_lines_chat_template_is_its_text_or_a_file(tmp_path):
    from pagedllm.model.chat_template import load_chat_template

    assert load_chat_template("{{ messages[0].content }}") == "{{ messages[0].content }}"
    path = tmp_path / "tools.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert load_chat_template(str(path)) == path.read_text()
    with pytest.raises(InvalidInputError, match="neither a template nor a file"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(InvalidInputError, match="does not compile"):
        load_chat_template("{% for m in messages %}")
