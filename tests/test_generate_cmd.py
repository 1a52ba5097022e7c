"""`pagedllm generate`: its chat options reach the template as given, and an option that would do nothing is
refused."""

import argparse

from pagedllm.entrypoints import generate_cmd
from pagedllm.entrypoints.cli import main


class Template:
    """An engine whose template hands back the messages it was given, in place of the ids."""

    def apply_chat_template(self, messages: list[dict]) -> tuple[str, list[dict]]:
        return "", messages


def prompt_of(**options) -> list[dict]:
    args = argparse.Namespace(**{"prompt": "hi", "chat": True, "system": None} | options)
    return generate_cmd._prompt(Template(), args)


def test_the_system_message_is_passed_as_given_even_empty():
    assert prompt_of() == [{"role": "user", "content": "hi"}]
    # empty: a template's default system prompt (SmolLM2's) is replaced, not kept
    assert prompt_of(system="") == [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]


def test_system_without_chat_is_refused(tmp_path, capsys):
    assert main(["generate", "hi", "--system", "be brief", "--model", str(tmp_path / "none.gguf")]) == 2
    assert "--system needs --chat" in capsys.readouterr().err
