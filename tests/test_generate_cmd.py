"""`pagedllm generate`: its chat options reach the template as given, and an option that would do nothing is
refused."""

import argparse

from pagedllm.entrypoints import generate_cmd
from pagedllm.entrypoints.cli import main


class Template:
    """An engine whose template hands back the messages it was given, in place of the ids."""

    def apply_chat_template(self, messages: list[dict], chat_template: str | None = None) -> tuple[str, list[dict]]:
        self.chat_template = chat_template
        return "", messages


def prompt_of(engine=None, template=None, **options) -> list[dict]:
    args = argparse.Namespace(**{"prompt": "hi", "chat": True, "system": None, "chat_template": None} | options)
    return generate_cmd._prompt(engine or Template(), args, template)


def test_the_system_message_is_passed_as_given_even_empty():
    assert prompt_of() == [{"role": "user", "content": "hi"}]
    # empty: a template's default system prompt (SmolLM2's) is replaced, not kept
    assert prompt_of(system="") == [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]


def test_system_without_chat_is_refused(tmp_path, capsys):
    assert main(["generate", "hi", "--system", "be brief", "--model", str(tmp_path / "none.gguf")]) == 2
    assert "--system needs --chat" in capsys.readouterr().err


def test_a_chat_template_of_ones_own_reaches_the_template(tmp_path, capsys):
    engine = Template()
    prompt_of(engine, template="{{ messages[0].content }}")
    assert engine.chat_template == "{{ messages[0].content }}"
    assert main(["generate", "hi", "--chat-template", "{{ 1 }}", "--model", str(tmp_path / "none.gguf")]) == 2
    assert "--chat-template needs --chat" in capsys.readouterr().err
    # a template that cannot be used stops the command before the model is read (the model path does not exist)
    assert main(["generate", "hi", "--chat", "--chat-template", str(tmp_path / "none.jinja"),
                 "--model", str(tmp_path / "none.gguf")]) == 2
    assert "neither a template nor a file" in capsys.readouterr().err


def test_a_thinking_budget_is_forced_with_the_reasoning_tags_and_refused_without(tiny_llama_dir, capsys):
    base = ["generate", "hi <think>", "--model", str(tiny_llama_dir), "--dtype", "float32", "--max-tokens", "24",
            "--thinking-token-budget", "2"]
    assert main(base) == 2
    assert "thinking_token_budget needs the reasoning tags" in capsys.readouterr().err
    config = '{"reasoning_start_str": "<think>", "reasoning_end_str": " Stop.</think>"}'
    assert main(base + ["--reasoning-config", config]) == 0
    assert " Stop.</think>" in capsys.readouterr().out
